#!/bin/bash
# session 14 call 3: 7B rows (graphs) b 1 4 16 with the tuned attention; GPU tests of the fast path and the methods.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 130 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -6
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_draft_model_fast.py -k "not compiled" > $OUT/t1.log 2>&1
echo "tests 1 rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_medusa_drafter.py tests/test_parallel_graphs.py \
  tests/test_peagle.py tests/test_dflash.py -k "not compiled" > $OUT/t2.log 2>&1
echo "tests 2 rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t2.log | tail -8
