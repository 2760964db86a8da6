#!/bin/bash
# session 16 call 5 (same warm machine): the parallel drafters' CUDA tests (their heads attend through masked_attention).
export PYTHONPATH=$PWD; timeout 105 python3 -m pytest -q -p no:cacheprovider -rfE -x tests/test_dflash.py tests/test_peagle.py -k "not compiled" > $OUT/t5.log 2>&1; echo "rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t5.log | tail -6
