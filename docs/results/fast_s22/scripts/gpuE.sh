#!/bin/bash
# Session 22, call E: GraphedDrafter drafting the parallel drafters' next step inside the update's graph
# (prefetch). GPU tests of the parallel graphs and the fast path's parallel rows; ms per step with prefetch on / off.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_parallel_graphs.py tests/test_fast_path.py \
  -k "not compiled and (peagle or dflash or dspark or parallel or medusa or graphed)" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 170 python3 docs/results/fast_s22/scripts/prefetch_parallel.py .fixtures/fx 4 2>&1 | grep -v Warn \
  > $OUT/prefetch.txt
echo "prefetch rc=$? at ${SECONDS}s"; cat $OUT/prefetch.txt
