#!/bin/bash
# Session 39, call E: as call D with the candidates timed as CUDA-graph replays (call D timed them eagerly, where the
# Triton launches' host time counted); two processes each way, alternating; the tuning GPU test.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T=100 bash docs/results/alternate_7b.sh $OUT/b7 on1 off1 on2 off2
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tuning.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -4
