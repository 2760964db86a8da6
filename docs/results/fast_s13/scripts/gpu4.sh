#!/bin/bash
# session 13 call 4: plan with 64-query programs at large batches; 7B rows (graphs) b 1 4 16; step profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -4
timeout 60 python3 .fixtures/bench_attn.py 2>&1 | grep -v -i warn | tee $OUT/attn.txt
timeout 120 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -6
timeout 60 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -14 | tee $OUT/prof_graphs.txt
