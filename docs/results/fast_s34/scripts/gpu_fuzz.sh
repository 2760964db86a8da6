#!/bin/bash
# Session 34 (prepared; no device was lent): the differential fuzz of generate() on the GPU, after
# docs/results/fast_s33/scripts/gpuA.sh: greedy runs (eager and fast path, real CUDA graphs and kernels) against plain
# greedy decoding and sampled pairs eager / fast under one seed, float32, ~4 minutes. No fixture needed.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
FUZZ_DEVICE=cuda FUZZ_SECONDS=230 timeout 280 python3 docs/results/fast_s34/scripts/fuzz_paths.py 80000 2000 \
  > $OUT/fuzz_cuda.log 2>&1
echo "fuzz rc=$? at ${SECONDS}s"
grep -v "^ \|eos_token_id must" $OUT/fuzz_cuda.log | cut -c1-300 | tail -12
