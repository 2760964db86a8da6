#!/bin/bash
# Session 36, call C: call A's failures pass alone (call B), so something earlier in the process matters. First the
# six tests with torch.empty filling new memory (-p fill_empty: a read of unwritten memory then fails every time),
# then test_fast_path.py's CUDA tests in file order as they are (call A's order), stopping at the first failure.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/docs/results/fast_s36/scripts CUBLAS_WORKSPACE_CONFIG=:4096:8; mkdir -p $OUT
T=$(cat docs/results/fast_s36/scripts/failing_tests.txt)  # six of call A's failures
B=${BUDGET:-170}
timeout $((B * 2 / 5)) python3 -m pytest -q -p no:cacheprovider -p fill_empty --tb=short -W ignore $T > $OUT/filled.log 2>&1
echo "filled rc=$? at ${SECONDS}s"; grep -a "^E \|^FAILED\|passed\|failed\|\.py:[0-9]*: " $OUT/filled.log | head -30 | cut -c1-250
timeout $((B - SECONDS)) python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_fast_path.py \
  -k "cuda and not compiled" > $OUT/order.log 2>&1
echo "in order rc=$? at ${SECONDS}s"; grep -a "^E \|^FAILED\|passed\|failed\|\.py:[0-9]*: " $OUT/order.log | head -20 | cut -c1-250
