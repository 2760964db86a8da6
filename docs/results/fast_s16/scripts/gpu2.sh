#!/bin/bash
# session 16 call 2: the dynamic tree's kernels, embed_concat, heads-last attention output: GPU tests, 7B rows,
# the per-phase profile, and a cold-L2 sweep of batch-1 verify attention.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_dynamic_tree_kernels.py tests/test_decoder_ops.py \
  tests/test_tree_attention.py tests/test_topk.py tests/test_eagle_drafter.py -k "not compiled" > $OUT/t2.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t2.log | tail -6
timeout 80 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -3
TOP=40 timeout 70 python3 .fixtures/prof_phase.py graphs 2>&1 | grep -v -i warn > $OUT/prof_phase.txt
grep "^==" $OUT/prof_phase.txt
timeout 150 python3 .fixtures/tune_attn_cold.py > $OUT/tune_attn_cold.txt 2>&1; tail -17 $OUT/tune_attn_cold.txt
cat $OUT/b7/results.md 2>/dev/null | tail -8
