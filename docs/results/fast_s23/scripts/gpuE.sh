#!/bin/bash
# Session 23, call E: where the row-rounding kernel and its reference differ on the GPU; the float8 tests again.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 docs/results/fast_s23/scripts/diag_quant.py 2>&1 | tee $OUT/diag.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
