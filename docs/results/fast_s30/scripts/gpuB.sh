#!/bin/bash
# Session 30, call B: the drafter's update and next draft folded into the verify step (GraphedDrafter fold=True).
# GPU tests of the captured drafters and the fast path; then the fold on / off A/B on the fixture (random heads).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 280 python3 -m pytest -q -p no:cacheprovider -rfE -x tests/test_parallel_graphs.py tests/test_graphs.py \
  "tests/test_fast_path.py" -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 200 python3 docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --out $OUT/fold.json \
  > $OUT/fold.log 2>&1
echo "fold rc=$? at ${SECONDS}s"; grep -v "Warn\|warn" $OUT/fold.log | cut -c1-240 | tail -22
