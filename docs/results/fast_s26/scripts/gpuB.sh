#!/bin/bash
# Session 26, call B: (1) weights prefetched into L2 while attention runs (l2_overlap.py, verify and plain stacks);
# (2) ragged batches (left-padded prompts, bench_fast_7b.py --ragged) at batch 4 and 16 with visible_end + kv_start
# (on) and without (novisible.py: prefix_end), alternating.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 docs/results/fast_s26/scripts/l2_overlap.py --out $OUT/l2_overlap.json > $OUT/l2_overlap.log 2>&1
echo "l2 rc=$? at ${SECONDS}s"; grep " ms" $OUT/l2_overlap.log
mkdir -p $OUT/b7
for run in on off; do
  pre=""; case $run in off*) pre="docs/results/fast_s25/scripts/novisible.py";; esac
  timeout 150 python3 $pre examples/bench_fast_7b.py --ragged --only fast_plain fast_spec_fr8 --batches 4 16 \
    --reps 10 --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b ragged $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
