#!/bin/bash
# Session 40, call E (H100): where the tuned 7B EAGLE-2 step's time goes now. The phase profile with PDL (GPU busy
# per phase) and without (SPECDEC_PDL=0: each kernel's own duration, no wait on its predecessor inside it), and the
# plain step's kernels without PDL.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FP8=1 SKINNY=16 FR=8192 TOP=30 timeout 100 python3 docs/results/fast_s16/scripts/prof_phase.py graphs \
  > $OUT/prof_fp8.txt 2>&1
echo "phase profile rc=$? at ${SECONDS}s"; grep "^== " $OUT/prof_fp8.txt
SPECDEC_PDL=0 FP8=1 SKINNY=16 FR=8192 TOP=30 timeout 100 python3 docs/results/fast_s16/scripts/prof_phase.py graphs \
  > $OUT/prof_fp8_nopdl.txt 2>&1
echo "phase profile no PDL rc=$? at ${SECONDS}s"; grep "^== " $OUT/prof_fp8_nopdl.txt
SPECDEC_PDL=0 timeout 90 python3 docs/results/fast_s24/scripts/prof_plain.py > $OUT/prof_plain_nopdl.txt 2>&1
echo "plain profile no PDL rc=$? at ${SECONDS}s"; grep "^== " $OUT/prof_plain_nopdl.txt
