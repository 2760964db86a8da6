#!/bin/bash
# session 18 call I: each parallel drafter's step alone on the fast path (random heads; GraphedDrafter counters,
# phase times), then the GPU tests of session 17's unrun commits (the restricted EAGLE-1 head).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 docs/results/fast_s18/scripts/diag_parallel.py .fixtures/fx 4 > $OUT/diag.log 2>&1
echo "diag rc=$?"; grep -v -i "warn\|Loading" $OUT/diag.log | tail -8
timeout 200 python3 -m pytest -q -x tests/test_eagle_vocab.py -k "not compiled" > $OUT/t.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/t.log
