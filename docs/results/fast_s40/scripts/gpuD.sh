#!/bin/bash
# Session 40, call D: the 7B batch-1 gate with the linear tuning, tuned / not tuned in alternating processes, the
# picks, and the tuning GPU test, on whichever card came (asked for an H200: the last H200 figure is session 30's).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bash docs/results/alternate_7b.sh $OUT/b7 on1 off1 on2
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tuning.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -4
