#!/bin/bash
# Session 40, call B (H100): call A's skinny40.py printed nothing in 330 s (most likely the warp-specialized TMA
# variants, listed last, hung); without them, progress per launch, a traceback when one takes over 45 s.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 280 python3 docs/results/fast_s40/scripts/skinny40.py $OUT/skinny40.json 230 > $OUT/skinny40.log 2>&1
echo "skinny40 rc=$? at ${SECONDS}s"
grep -v "^  " $OUT/skinny40.log | head -60
tail -5 $OUT/skinny40.log
