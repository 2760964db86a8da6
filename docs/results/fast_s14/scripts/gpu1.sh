#!/bin/bash
# session 14 call 1: tree_attention launch sweep; kernel tests after session 13's one-launch change.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 .fixtures/tune_attn.py 2>&1 | grep -v -i warn | tee $OUT/tune_attn.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_decode_attention.py \
  > $OUT/t1.log 2>&1
echo "kernel tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
