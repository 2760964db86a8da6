#!/bin/bash
# Session 25, call B: tree attention with visible_end (no mask read for a dense row's committed slots), swept.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/fast_s25/scripts
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
timeout 400 python3 $S/attn_visible_sweep.py $OUT/attn_visible.json > $OUT/attn_visible.txt 2>&1
echo "attn rc=$? at ${SECONDS}s"; grep -v "^  fail" $OUT/attn_visible.txt | tail -60; grep -c fail $OUT/attn_visible.txt
