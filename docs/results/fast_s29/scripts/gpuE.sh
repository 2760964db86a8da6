#!/bin/bash
# Session 29, call E: the 7B shape's fast plain step and one EAGLE-2 step (float8 FR-Spec head, 60-node tree of
# depth 6) at this session's code, batch 1 / 4 / 16.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 170 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 16 --reps 20 --warmup 3 \
  --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "rc=$? at ${SECONDS}s"; grep -v "Warn\|warn" $OUT/b7.log | tail -12
