#!/bin/bash
# Session 23, call F: the float8 tests again (value equality of the row rounding on the GPU; the lossless decode
# test on a float32 target); the 7B EAGLE-2 step's profile with the FR-Spec head rounded to float8.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
FP8=1 SKINNY=16 FR=8192 TOP=30 timeout 120 python3 docs/results/fast_s16/scripts/prof_phase.py graphs > $OUT/prof_fp8.txt 2>&1
echo "profile rc=$? at ${SECONDS}s"; grep -A12 "^==" $OUT/prof_fp8.txt | cut -c1-150
