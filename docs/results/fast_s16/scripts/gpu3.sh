#!/bin/bash
# session 16 call 3: the rerank in two launches, the update mask in one: GPU tests, 7B rows, per-phase profile,
# top-k chunk widths (in order of need: device time was short after many refused starts).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 70 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_dynamic_tree_kernels.py tests/test_kernels.py \
  -k "dynamic or rerank or grow or bad_shapes or head_update or head_tree" > $OUT/t3a.log 2>&1
echo "tree kernels rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3a.log | tail -4
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_eagle_drafter.py \
  -k "not compiled" > $OUT/t3b.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3b.log | tail -6
timeout 75 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -3
cat $OUT/b7/results.md 2>/dev/null | tail -3
TOP=40 timeout 55 python3 .fixtures/prof_phase.py graphs 2>&1 | grep -v -i warn > $OUT/prof_phase.txt
grep "^==" $OUT/prof_phase.txt
timeout 25 python3 .fixtures/bench_topk_chunk.py > $OUT/topk_chunk.txt 2>&1; tail -4 $OUT/topk_chunk.txt
