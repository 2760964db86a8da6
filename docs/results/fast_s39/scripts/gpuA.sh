#!/bin/bash
# Session 39, call A: where the 7B EAGLE-2 step's time goes on this card (H100 in session 38: 1.51x the plain step
# against 1.42x on the H200). Baseline timing, then the plain step's kernels and the EAGLE-2 step's phases.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
mkdir -p $OUT/b7
timeout 100 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
  --warmup 3 --draft-vocab 8192 --out $OUT/b7/r1 > $OUT/b7/r1.log 2>&1
echo "7b rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/r1.log | cut -d'|' -f2-8
timeout 90 python3 docs/results/fast_s24/scripts/prof_plain.py > $OUT/prof_plain.txt 2>&1
echo "plain profile rc=$? at ${SECONDS}s"; grep -A14 "^== plain" $OUT/prof_plain.txt | cut -c1-110
FP8=1 SKINNY=16 FR=8192 TOP=24 timeout 100 python3 docs/results/fast_s16/scripts/prof_phase.py graphs \
  > $OUT/prof_fp8.txt 2>&1
echo "phase profile rc=$? at ${SECONDS}s"; grep -A24 "^== " $OUT/prof_fp8.txt | cut -c1-110
