# Session 47, call A: session 46's review refactor (SplitOutputs, flat_rows) on the GPU with the summing launch and
# with the fixup; then the 7B gate with kernels scheduled two deep (SPECDEC_PDL_EARLY=1) against the library,
# alternating processes; then the fused / graphs GPU tests with the early schedule.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q tests/test_skinny.py tests/test_int4.py tests/test_fp8.py -k "gpu" > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log)"; grep -m5 "FAILED\|Error" $OUT/pytest.log
SPECDEC_SPLIT_FIXUP=1 timeout 60 python3 -m pytest -q tests/test_skinny.py tests/test_int4.py -k "gpu" > $OUT/pytest_fix.log 2>&1
echo "pytest fixup: $(tail -1 $OUT/pytest_fix.log)"; grep -m5 "FAILED\|Error" $OUT/pytest_fix.log
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for e in 0 1 0 1; do
  i=$((i+1))
  SPECDEC_PDL_EARLY=$e timeout 75 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_early$e.log 2>&1
  echo "early=$e: $(grep 'batch 1:' $OUT/b7_${i}_early$e.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_early$e.log
done
SPECDEC_PDL_EARLY=1 timeout 130 python3 -m pytest -q -x tests/test_fused.py tests/test_graphs.py tests/test_int4.py -k "gpu or cuda or graph" > $OUT/pytest_early.log 2>&1
echo "pytest early: $(tail -1 $OUT/pytest_early.log)"; grep -m5 "FAILED\|Error" $OUT/pytest_early.log
