#!/bin/bash
# Prepared in session 48 for the next device (not run): the 7B gate at this code in three more processes, batch 4
# and 16 beside it, then the kernel test files at this code (test_kernels, test_int4, test_fp8, test_skinny).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192"
for i in 1 2 3; do
  timeout 70 python3 examples/bench_fast_7b.py $ARGS --batches 1 > $OUT/b7_$i.log 2>&1
  echo "gate $i: $(grep 'batch 1:' $OUT/b7_$i.log | cut -c1-300)"
done
timeout 150 python3 examples/bench_fast_7b.py $ARGS --batches 4 16 > $OUT/b7_batches.log 2>&1
grep "batch [0-9]*:" $OUT/b7_batches.log | cut -c1-300
timeout 240 python3 -m pytest -q tests/test_kernels.py tests/test_int4.py tests/test_fp8.py tests/test_skinny.py \
  -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED" $OUT/pytest.log
true
