#!/bin/bash
# Session 25, call G: the remaining CUDA suites with programmatic dependent launch on (call F's -k filter had
# deselected them): CUDA graphs around the drafters, the draft model and Medusa on the fast path.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_graphs.py \
  tests/test_draft_model_fast.py tests/test_medusa_drafter.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
