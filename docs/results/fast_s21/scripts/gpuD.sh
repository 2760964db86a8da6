#!/bin/bash
# Session 21, call D: the captured drafters' GPU tests under the cuBLASLt captures (draft model, EAGLE, Medusa, the
# parallel drafters, the graphs), then session 16's phase profile of one 7B EAGLE-2 step (batch 1, graphs).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_eagle_drafter.py tests/test_medusa_drafter.py \
  tests/test_parallel_graphs.py tests/test_draft_model_fast.py tests/test_graphs.py -k "not compiled" \
  > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
TOP=30 timeout 150 python3 docs/results/fast_s16/scripts/prof_phase.py graphs > $OUT/prof_phase.txt 2>&1
echo "prof rc=$? at ${SECONDS}s"; grep "^==" $OUT/prof_phase.txt
