#!/bin/bash
# Session 24, call I: the float8 rows rounded by their producers (add_rms_norm, silu_mul, embed_concat). GPU tests of
# the float8 heads and the fused ops; the 7B EAGLE-2 step at batch 1 (two processes); the step's phase profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py tests/test_decoder_ops.py \
  tests/test_nn_inference.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
mkdir -p $OUT/b7
for run in 1 2; do
  timeout 60 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/r$run > $OUT/b7/r$run.log 2>&1
  echo "7b run $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/r$run.log | cut -d'|' -f2,5,18,22
done
FP8=1 SKINNY=16 FR=8192 TOP=14 timeout 70 python3 docs/results/fast_s16/scripts/prof_phase.py graphs \
  > $OUT/prof_fp8.txt 2>&1
echo "profile rc=$? at ${SECONDS}s"; grep -A8 "^== propose\|^== update" $OUT/prof_fp8.txt | cut -c1-110
