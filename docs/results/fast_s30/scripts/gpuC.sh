#!/bin/bash
# Session 30, call C: the fold on / off interleaved call by call (random heads, fixture target), the drafts compared.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 300 python3 docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --reps 6 --out $OUT/fold.json \
  > $OUT/fold.log 2>&1
echo "fold rc=$? at ${SECONDS}s"; grep -v "Warn\|warn\|Loading" $OUT/fold.log | cut -c1-260 | tail -14
