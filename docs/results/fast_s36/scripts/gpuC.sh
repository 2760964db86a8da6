#!/bin/bash
# Session 36, call C: call A's failures pass alone (call B), so something earlier in the process matters. First the
# six tests with torch.empty filling new memory (-p fill_empty: a read of unwritten memory then fails every time),
# then test_fast_path.py's CUDA tests in file order as they are (call A's order), stopping at the first failure.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/docs/results/fast_s36/scripts CUBLAS_WORKSPACE_CONFIG=:4096:8; mkdir -p $OUT
T="tests/test_fast_path.py::test_greedy_fast_path_is_token_identical_to_the_eager_path[prompt_lookup-1-cuda]
tests/test_fast_path.py::test_greedy_fast_path_is_token_identical_to_the_eager_path[draft_model_tree-1-cuda]
tests/test_fast_path.py::test_later_calls_on_held_buffers_give_the_eager_tokens[draft_model_chain-1-cuda]
tests/test_fast_path.py::test_verify_forwards_read_the_committed_prefix_as_one_mask_row_and_decode_the_same[draft_model_tree-cuda]
tests/test_parallel_graphs.py::test_the_fast_path_with_each_parallel_drafter_gives_the_eager_tokens[medusa-cuda]
tests/test_parallel_graphs.py::test_the_verify_step_runs_the_update_and_next_draft_folded_with_the_same_drafts[peagle-cuda]"
B=${BUDGET:-170}
timeout $((B * 2 / 5)) python3 -m pytest -q -p no:cacheprovider -p fill_empty --tb=short -W ignore $T > $OUT/filled.log 2>&1
echo "filled rc=$? at ${SECONDS}s"; grep -a "^E \|^FAILED\|passed\|failed\|\.py:[0-9]*: " $OUT/filled.log | head -30 | cut -c1-250
timeout $((B - SECONDS)) python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_fast_path.py \
  -k "cuda and not compiled" > $OUT/order.log 2>&1
echo "in order rc=$? at ${SECONDS}s"; grep -a "^E \|^FAILED\|passed\|failed\|\.py:[0-9]*: " $OUT/order.log | head -20 | cut -c1-250
