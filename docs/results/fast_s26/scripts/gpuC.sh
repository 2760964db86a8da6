#!/bin/bash
# Session 26, call C: the torch.compile'd fast paths on the GPU with programmatic dependent launch on (session 25
# deselected them when its device time ran out), the ragged-batch (left-padded, kv_start) tests and the compile checks.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
python3 -c "import specdec.kernels as k; print('pdl on:', k.pdl_enabled())"
timeout 540 python3 -m pytest -q -p no:cacheprovider -rfE tests/ -k "compiled or compile or ragged or kv_start or left_padded" > $OUT/tests_compiled.log 2>&1
echo "compiled tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests_compiled.log | tail -8
