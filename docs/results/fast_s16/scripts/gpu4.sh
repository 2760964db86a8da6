#!/bin/bash
# session 16 call 4 (same warm machine as call 3): the compiled fast-path, drafter and tree-attention tests.
export PYTHONPATH=$PWD; timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_eagle_drafter.py tests/test_tree_attention.py -k "compiled or compile" > $OUT/t4.log 2>&1; echo "rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t4.log | tail -6
