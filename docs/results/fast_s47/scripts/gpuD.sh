# Session 47, call D: the landed defaults (the early order, the head's products prefetching 512 bytes of each weight
# row) against the one-ahead order (SPECDEC_PDL_EARLY=0), alternating processes; then the GPU tests at these defaults.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for e in 1 0 1; do
  i=$((i+1))
  SPECDEC_PDL_EARLY=$e timeout 60 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_early$e.log 2>&1
  echo "early=$e (defaults otherwise): $(grep 'batch 1:' $OUT/b7_${i}_early$e.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_early$e.log
done
timeout 300 python3 -m pytest -q tests/test_kernels.py tests/test_int4.py tests/test_fp8.py tests/test_skinny.py tests/test_gpu.py tests/test_fast_path.py -k "gpu or cuda or fast or pdl" -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log | cut -c1-200)"; grep -m8 "FAILED\|Error" $OUT/pytest.log | cut -c1-300
grep -c PASSED $OUT/pytest.log; true
