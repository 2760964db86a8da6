#!/bin/bash
# Session 32, call B: the verify step's tree mask inside its graph (tree_mask_at; present found from the parents;
# the parents handed to decide). The A/B against session 31's host-built mask (interleaved, fixture, random heads),
# the host profile again, the 7B step at batch 1 / 4 / 16, then the GPU tests. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 150 python3 docs/results/fast_s32/scripts/mask_ab.py --fx $F --prompts 3 --reps 4 --out $OUT/mask_ab.json \
  > $OUT/mask_ab.log 2>&1
echo "mask_ab rc=$? at ${SECONDS}s"
timeout 100 python3 docs/results/fast_s32/scripts/host_profile.py --fx $F --out $OUT/host > $OUT/host.log 2>&1
echo "host_profile rc=$? at ${SECONDS}s"
timeout 150 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 16 --reps 20 --warmup 3 \
  --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "bench_fast_7b rc=$? at ${SECONDS}s"
timeout $((585 - SECONDS)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_parallel_graphs.py tests/test_medusa_drafter.py tests/test_prompt_lookup.py \
  tests/test_graphs.py tests/test_gpu.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
grep -v "Warn\|warn\|Loading" $OUT/host.log | tail -4
grep -a "^| 1\|^| 4\|^| 16\|^batch" $OUT/b7.log | tail -6
grep -v "Warn\|warn\|Loading" $OUT/mask_ab.log | tail -4
