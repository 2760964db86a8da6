# Session 46, call D: the landed 4-bit product (padded widths, UNROLL) on the GPU: its tests and the float8 file's
# decoding tests (both formats), then the 7B gate at 128 and 64 inputs per scale, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_int4.py tests/test_fp8.py tests/test_kernel_compile.py -k "gpu or compile" > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log)"
grep -m5 "FAILED\|Error" $OUT/pytest.log
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for g in 128 64 128 64; do
  i=$((i+1))
  timeout 60 python3 examples/bench_fast_7b.py $ARGS --int4-group $g > $OUT/b7_${i}_g$g.log 2>&1
  echo "g$g: $(grep 'batch 1:' $OUT/b7_${i}_g$g.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_g$g.log
done
