# Session 46, call E: split products summed inside their launch (use_split_fixup; SPECDEC_SPLIT_FIXUP=0 restores
# the summing launch): the GPU tests of the three products, then the 7B gate both ways, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 110 python3 -m pytest -q tests/test_skinny.py tests/test_int4.py tests/test_fp8.py -k "gpu" > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log)"
grep -m5 "FAILED\|Error" $OUT/pytest.log
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for fix in 1 0 1 0; do
  i=$((i+1))
  SPECDEC_SPLIT_FIXUP=$fix timeout 50 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_fix$fix.log 2>&1
  echo "fixup=$fix: $(grep 'batch 1:' $OUT/b7_${i}_fix$fix.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_fix$fix.log
done
