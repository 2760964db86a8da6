#!/bin/bash
# session 13 call 2: tree_attention plans + kv_end; 7B step profile (graphs; drafter compiled).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_decode_attention.py \
  > $OUT/t1.log 2>&1
echo "kernel tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
timeout 90 python3 .fixtures/bench_attn.py 2>&1 | grep -v -i warn | tee $OUT/attn.txt
timeout 90 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -30 | tee $OUT/prof_graphs.txt
timeout 250 python3 .fixtures/prof_7b.py dcompile 2>&1 | grep -v -i warn | head -45 | tee $OUT/prof_dcompile.txt
