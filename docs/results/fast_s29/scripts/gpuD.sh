#!/bin/bash
# Session 29, call D: the fast-path GPU tests on a trial change (the replays' input copies and output clones grouped
# into one torch._foreach_copy_ per dtype: specdec.graphs.copy_all / clone_all), then its A/B timing against one
# copy_ per tensor (host_split.py --ab). The change was slower and did not land. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_graphs.py tests/test_parallel_graphs.py \
  tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
timeout 160 python3 docs/results/fast_s29/scripts/host_split.py --fx .fixtures/fx --ab --out $OUT/ab.json > $OUT/ab.log 2>&1
echo "ab rc=$? at ${SECONDS}s"; grep -v "Load\|Warn\|warn" $OUT/ab.log | tail -14
