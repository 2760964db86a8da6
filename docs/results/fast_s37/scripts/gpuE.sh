#!/bin/bash
# Session 37, call E: the fix for session 36's GPU identity failures (a captured graph now keeps the tensors its
# function closes over; the verify step's root-column constant lives with the buffers). First the GPU test files in
# one process at the fixed code (session 36's call A found 13 failures there), then test_fast_path + test_parallel_graphs
# with the fix undone (-p no_keep) to show the defect comes back, then session 34's differential fuzz on CUDA for the
# time left (many models in one process: the allocator reuses memory all the time). No fixture needed.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/docs/results/fast_s37/scripts; mkdir -p $OUT
B=${BUDGET:-560}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
FILES="tests/test_kernels.py tests/test_fast_path.py tests/test_eagle_drafter.py tests/test_parallel_graphs.py
  tests/test_medusa_drafter.py tests/test_prompt_lookup.py tests/test_graphs.py tests/test_gpu.py
  tests/test_tree_attention.py tests/test_inputs.py"
timeout $((B * 11 / 20)) python3 -m pytest -q -rf -p no:cacheprovider $FILES -k "not compiled" > $OUT/tests.log 2>&1
echo "fixed: tests rc=$? at ${SECONDS}s"; grep -a "^FAILED\|^ERROR" $OUT/tests.log | head -20 | cut -c1-250
tail -1 $OUT/tests.log
timeout $((B * 4 / 5 - SECONDS)) python3 -m pytest -q -rf -p no:cacheprovider -p no_keep tests/test_fast_path.py \
  tests/test_parallel_graphs.py -k "cuda and not compiled" > $OUT/undone.log 2>&1
echo "fix undone: rc=$? at ${SECONDS}s"; grep -a "^FAILED" $OUT/undone.log | head -20 | cut -c1-250; tail -1 $OUT/undone.log
left=$((B - SECONDS - 15))
if [ $left -gt 40 ]; then
  FUZZ_DEVICE=cuda FUZZ_SECONDS=$((left - 20)) timeout $left python3 docs/results/fast_s34/scripts/fuzz_paths.py 90000 2000 \
    > $OUT/fuzz_cuda.log 2>&1
  echo "fuzz rc=$? at ${SECONDS}s"; grep -v "^ \|eos_token_id must" $OUT/fuzz_cuda.log | cut -c1-300 | tail -6
fi
