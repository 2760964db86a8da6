# Session 48, call D (the budget's rest): the last fast-path tests call B's time limit did not reach, then one more 7B
# gate process at this code.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 75 python3 -m pytest -q tests/test_fast_path.py -p no:cacheprovider -k "dispatch_to_their_references or near_the_budget or late_commits_keep or captured_forward_and_commit or sync_false_hand_over or bad_draft_id_on_a_late or late_steps_stop_rows or ends_on_the_shape" > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m5 "^FAILED" $OUT/pytest.log | cut -c1-200
timeout 60 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 \
  --warmup 3 --draft-vocab 8192 > $OUT/b7.log 2>&1
echo "7B gate: $(grep 'batch 1:' $OUT/b7.log | cut -c1-300)"
true
