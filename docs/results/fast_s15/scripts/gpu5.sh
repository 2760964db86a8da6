#!/bin/bash
# session 15 call 5: every level's RoPE rows made once per step; the 7B row at batch 1 and the drafter's CUDA tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 75 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -3
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_eagle_drafter.py \
  -k "not compiled" > $OUT/t5.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t5.log | tail -6
