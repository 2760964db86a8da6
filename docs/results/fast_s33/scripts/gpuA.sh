#!/bin/bash
# Session 33, call A (prepared; no device was lent in session 33): the GPU tests at this code (session 32's in-graph
# verify mask and session 33's in-place drafter inputs: test_graphs.py's new tests skip nothing on CUDA), then the
# two interleaved fixture A/Bs that were never run: session 33's in-place inputs (inplace_ab.py) and session 32's
# in-graph mask (mask_ab.py). Carry .fixtures/fx. Run gpuB.sh next (host profile, the 7B step, EAGLE's fold).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 260 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_parallel_graphs.py tests/test_medusa_drafter.py tests/test_prompt_lookup.py \
  tests/test_graphs.py tests/test_gpu.py tests/test_tree_attention.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
timeout 150 python3 docs/results/fast_s33/scripts/inplace_ab.py --fx $F --prompts 3 --reps 4 \
  --out $OUT/inplace_ab.json > $OUT/inplace_ab.log 2>&1
echo "inplace_ab rc=$? at ${SECONDS}s"
timeout $((590 - SECONDS)) python3 docs/results/fast_s32/scripts/mask_ab.py --fx $F --prompts 3 --reps 4 \
  --out $OUT/mask_ab.json > $OUT/mask_ab.log 2>&1
echo "mask_ab rc=$? at ${SECONDS}s"
grep -v "Warn\|warn\|Loading" $OUT/inplace_ab.log | cut -c1-300 | tail -4
grep -v "Warn\|warn\|Loading" $OUT/mask_ab.log | cut -c1-300 | tail -5
