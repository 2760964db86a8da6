#!/bin/bash
# Session 30, call A: where the 7B steps' device time sits idle (gaps.py), and the 7B step at this code.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 200 python3 docs/results/fast_s30/scripts/gaps.py > $OUT/gaps.txt 2>&1
echo "gaps rc=$? at ${SECONDS}s"; grep -v "Warn\|warn" $OUT/gaps.txt | head -80 | cut -c1-150
timeout 120 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 \
  --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "b7 rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7.log | cut -d'|' -f2,5,18,22
