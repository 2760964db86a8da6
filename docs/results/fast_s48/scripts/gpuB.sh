# Session 48, call B: the GPU tests of this session's changes (decoder_inputs, owned update outputs read in place by
# the next draft, copy_changed / the all-rows constant) and of the fast path; then the 7B gate, session 47's code
# (898ff71, archived in .fixtures/old) against this one, alternating processes; then host_gap.py.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 230 python3 -m pytest -q -x tests/test_decoder_ops.py tests/test_graphs.py tests/test_fast_path.py tests/test_gpu.py -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED\|^ERROR\|Error" $OUT/pytest.log | cut -c1-300
tail -1 $OUT/pytest.log | cut -c1-120
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for code in old new old new; do
  i=$((i+1))
  if [ $code = old ]; then P=.fixtures/old; else P=.; fi
  PYTHONPATH=$P timeout 70 python3 $P/examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_${code}.log 2>&1
  echo "$code: $(grep 'batch 1:' $OUT/b7_${i}_${code}.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_${code}.log
done
timeout 110 python3 docs/results/fast_s48/scripts/host_gap.py 15 > $OUT/host_gap.log 2>&1
grep -v Warning $OUT/host_gap.log | tail -8
true
