# Session 46, call C: the 4-bit product with UNROLL chunks a step (128 bytes of a weight row a step at every group
# size): the sweep per group size, the GPU tests, then the 7B gate with the library's defaults at 64, 128 and 32
# inputs per scale (float8 beside each in the same process).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 docs/results/fast_s46/scripts/int4_sweep.py $OUT/int4_sweep.json --deadline 170 > $OUT/sweep.log 2>&1
grep -v Warning $OUT/sweep.log | tail -20
timeout 120 python3 -m pytest -q -x tests/test_int4.py -k "gpu" > $OUT/pytest_int4.log 2>&1
echo "pytest int4: $(tail -1 $OUT/pytest_int4.log)"
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for g in 64 128 32 64; do
  i=$((i+1))
  timeout 60 python3 examples/bench_fast_7b.py $ARGS --int4-group $g > $OUT/b7_${i}_g$g.log 2>&1
  echo "g$g: $(grep 'batch 1:' $OUT/b7_${i}_g$g.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_g$g.log
done
