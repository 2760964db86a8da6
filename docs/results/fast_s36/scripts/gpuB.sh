#!/bin/bash
# Session 36, call B: call A's GPU test failures (token identity of the fast path with SpS, prompt lookup, Medusa and
# the folded drafters; EAGLE-2 unfolded passed) run three ways: as they are, without programmatic dependent launch
# (SPECDEC_PDL=0), and with graphed drafters copying every input (-p no_in_place). Carry nothing.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/docs/results/fast_s36/scripts; mkdir -p $OUT
T="tests/test_fast_path.py::test_greedy_fast_path_is_token_identical_to_the_eager_path[prompt_lookup-1-cuda]
tests/test_fast_path.py::test_greedy_fast_path_is_token_identical_to_the_eager_path[draft_model_tree-1-cuda]
tests/test_fast_path.py::test_later_calls_on_held_buffers_give_the_eager_tokens[draft_model_chain-1-cuda]
tests/test_fast_path.py::test_verify_forwards_read_the_committed_prefix_as_one_mask_row_and_decode_the_same[draft_model_tree-cuda]
tests/test_parallel_graphs.py::test_the_fast_path_with_each_parallel_drafter_gives_the_eager_tokens[medusa-cuda]
tests/test_parallel_graphs.py::test_the_verify_step_runs_the_update_and_next_draft_folded_with_the_same_drafts[peagle-cuda]"
B=${BUDGET:-300}
timeout $((B * 2 / 5)) python3 -m pytest -q -p no:cacheprovider --tb=short $T > $OUT/as_is.log 2>&1
echo "as is rc=$? at ${SECONDS}s"; tail -8 $OUT/as_is.log | cut -c1-250
timeout $((B * 3 / 10)) env SPECDEC_PDL=0 python3 -m pytest -q -p no:cacheprovider --tb=line $T > $OUT/no_pdl.log 2>&1
echo "no PDL rc=$? at ${SECONDS}s"; tail -8 $OUT/no_pdl.log | cut -c1-250
timeout $((B - SECONDS)) python3 -m pytest -q -p no:cacheprovider -p no_in_place --tb=line $T > $OUT/copying.log 2>&1
echo "copying rc=$? at ${SECONDS}s"; tail -8 $OUT/copying.log | cut -c1-250
grep -a "^E " $OUT/as_is.log | head -30 | cut -c1-300
