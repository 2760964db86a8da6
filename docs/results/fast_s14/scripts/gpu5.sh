#!/bin/bash
# session 14 call 5: rope_store over blocks of 16 heads: tests, 7B rows b 1 4 16 (graphs), the b16 profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 110 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -5
ROWS=16 timeout 60 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -12 > $OUT/prof_graphs_b16.txt
grep -E "step wall|rope_store|_tree_split" $OUT/prof_graphs_b16.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_decoder_ops.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py -k "not compiled" > $OUT/t1.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
