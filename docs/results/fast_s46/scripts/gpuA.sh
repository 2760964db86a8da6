# Session 46, call A: the library's 4-bit head (specdec.nn.quantize_int4_, specdec.kernels.linear_int4) on the GPU:
# its tests, then the 7B gate with the float8 and the 4-bit FR-Spec heads in one process per group size
# (alternating), then the tests of the float8 path it shares.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -x tests/test_int4.py -k "gpu" > $OUT/pytest_int4.log 2>&1
echo "pytest int4: $(tail -1 $OUT/pytest_int4.log)"
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for g in 128 64 32 128; do
  i=$((i+1))
  timeout 80 python3 examples/bench_fast_7b.py $ARGS --int4-group $g > $OUT/b7_${i}_g$g.log 2>&1
  echo "g$g: $(grep 'batch 1:' $OUT/b7_${i}_g$g.log | cut -c1-400)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_g$g.log
done
timeout 100 python3 -m pytest -q tests/test_fp8.py -k "gpu" > $OUT/pytest_fp8.log 2>&1
echo "pytest fp8 (gpu): $(tail -1 $OUT/pytest_fp8.log)"
