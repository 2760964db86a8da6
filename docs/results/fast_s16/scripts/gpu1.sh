#!/bin/bash
# session 16 call 1: where a 7B EAGLE-2 step's kernels go, per phase; GPU tests of session 15's review commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
TOP=70 timeout 120 python3 .fixtures/prof_phase.py graphs 2>&1 | grep -v -i warn > $OUT/prof_phase.txt
tail -5 $OUT/prof_phase.txt; grep "^==" $OUT/prof_phase.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fused.py tests/test_nn_inference.py \
  tests/test_fast_path.py -k "not compiled" > $OUT/t1.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -6
