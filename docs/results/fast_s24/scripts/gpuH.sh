#!/bin/bash
# Session 24, call H: call G's A/B again with the "off" runs (noprefix.py was missing there): the 7B EAGLE-2 step
# (FR-Spec 8192, float8 head) at batch 4 and 16 without and with the shared-prefix reads, alternating.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/b7
for run in off on off2; do
  pre=""; case $run in off*) pre="docs/results/fast_s24/scripts/noprefix.py";; esac
  timeout 100 python3 $pre examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 4 16 --reps 10 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b prefix $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
