# Prepared in session 47 for the next device (not run): (0) the GPU tests of session 47's late kernels (kept_at_ends, table_rows, last_rows,
# sanitised_ids, packed_tokens, tree_mask_at without present) and of the fast path at this code; (1) where the early
# chain breaks, one step in order (chain_breaks.py SEQ=1, 4-bit head); (2) the 7B gate with EAGLE's fold (update +
# next draft inside the verify step's graph: one replay a step, no copies between graphs) against the default,
# alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 220 python3 -m pytest -q -x tests/test_kernels.py tests/test_decoder_ops.py tests/test_fast_path.py tests/test_eagle_drafter.py -k "kept or sanitised or tree_mask_at or table_rows or pdl or gpu or cuda or fast" -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log | cut -c1-200)"; grep -m5 "^FAILED\|^ERROR" $OUT/pytest.log | cut -c1-300
SEQ=1 INT4=128 FR=8192 timeout 80 python3 docs/results/fast_s47/scripts/chain_breaks.py > $OUT/breaks4.log 2>&1
sed -n '/== eagle2/,/-- specdec/p' $OUT/breaks4.log | cut -c1-150 | head -30
sed -n '/one step/,$p' $OUT/breaks4.log | cut -c1-170 | head -60
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for f in "" "--eagle-fold" "" "--eagle-fold"; do
  i=$((i+1))
  timeout 70 python3 examples/bench_fast_7b.py $ARGS $f > $OUT/b7_${i}.log 2>&1
  echo "${f:-default}: $(grep 'batch 1:' $OUT/b7_${i}.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}.log
done
true
