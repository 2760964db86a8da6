#!/bin/bash
# session 16 call 3: the rerank in two launches (ranks over blocks, then places): GPU tests, 7B rows, per-phase profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_dynamic_tree_kernels.py > $OUT/t3a.log 2>&1
echo "tree kernels rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3a.log | tail -4
timeout 80 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -3
TOP=40 timeout 70 python3 .fixtures/prof_phase.py graphs 2>&1 | grep -v -i warn > $OUT/prof_phase.txt
grep "^==" $OUT/prof_phase.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_peagle.py tests/test_dflash.py tests/test_parallel_graphs.py \
  -k "not compiled" > $OUT/t3b.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3b.log | tail -6
cat $OUT/b7/results.md 2>/dev/null | tail -3
