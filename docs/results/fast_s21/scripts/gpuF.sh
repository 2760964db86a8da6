#!/bin/bash
# Session 21, call F: the compiled fast-path, drafter and tree-attention tests (torch.compile before capture) with
# the captures on cuBLASLt, session 16's call-4 selection.
export PYTHONPATH=$PWD; timeout 185 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_tree_attention.py -k "compiled or compile" > $OUT/t.log 2>&1
echo "rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t.log | tail -6
