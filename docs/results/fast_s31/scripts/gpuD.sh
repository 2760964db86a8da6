#!/bin/bash
# Session 31, call D: the n-gram kernel against the torch search inside the same drafters (eager and folded),
# interleaved in one process; batch 1, 4 and 16. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 400 python3 docs/results/fast_s31/scripts/lookup_ab.py --fx $F --prompts 6 --reps 4 --batch 4 16 \
  --torch-search --out $OUT/lookup.json > $OUT/lookup.log 2>&1
echo "lookup_ab rc=$? at ${SECONDS}s"
grep -v "Warn\|warn\|Loading" $OUT/lookup.log | tail -19
