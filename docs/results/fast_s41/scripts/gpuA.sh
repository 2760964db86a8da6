#!/bin/bash
# Session 41 (prepared; no device was lent this session): one call, no fixture, ~7 minutes.
# 1. Session 40's call E, never run (its machine died): the tuned 7B EAGLE-2 step's phase profile with PDL and
#    without (SPECDEC_PDL=0), and the plain step's kernels without PDL.
# 2. The differential fuzz of generate() on the GPU with the head variants session 41 added (FUZZ_HEADS=1: draft
#    vocabularies and float8 weights on EAGLE-1/2/3, DFlash and DSpark heads), real CUDA graphs and kernels.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT bash docs/results/fast_s40/scripts/gpuE.sh
FUZZ_DEVICE=cuda FUZZ_HEADS=1 FUZZ_METHODS=eagle1,eagle2,eagle3,dflash,dspark FUZZ_SECONDS=100 timeout 150 \
  python3 docs/results/fast_s34/scripts/fuzz_paths.py 110000 2000 > $OUT/fuzz_heads_cuda.log 2>&1
echo "fuzz rc=$? at ${SECONDS}s"
grep -v "^ \|eos_token_id must" $OUT/fuzz_heads_cuda.log | cut -c1-300 | tail -8
