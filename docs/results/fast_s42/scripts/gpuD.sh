#!/bin/bash
# Session 42, call D (one GPU, no fixture, ~6 min): the linear tuning timing each product after a fused norm launch
# (as a forward runs it), in alternating processes against session 42's skinny-only run (force_skinny.py); its GPU
# tests; then the CUDA fuzz of every drafter with the capture fix (call B ran the head variants).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT/b7
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_tuning.py tests/test_skinny.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/tests.log)"
for run in ch1 sk1 ch2 sk2; do
  prog=examples/bench_fast_7b.py; case $run in sk*) prog=docs/results/fast_s42/scripts/force_skinny.py;; esac
  timeout 110 python3 $prog --only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192 \
    --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "$run rc=$? at ${SECONDS}s: $(grep '^| 1 ' $OUT/b7/$run.log | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
grep -h "linear picks" $OUT/b7/ch1.log $OUT/b7/ch2.log | cut -c1-400
FUZZ_DEVICE=cuda FUZZ_SECONDS=100 timeout 150 python3 docs/results/fast_s34/scripts/fuzz_paths.py 120000 3000 \
  > $OUT/fuzz_cuda.log 2>&1
echo "fuzz rc=$? at ${SECONDS}s: $(tail -1 $OUT/fuzz_cuda.log)"
grep -c "^MISMATCH\|^ERROR\|^STREAM" $OUT/fuzz_cuda.log
