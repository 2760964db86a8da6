#!/bin/bash
# session 12 call 4: tree attention on by default: GPU tests of the fast path; 7B step profile; 7B plain vs spec rows.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 140 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -10
timeout 80 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -30 | tee $OUT/prof_graphs_tree.txt
timeout 150 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -12
