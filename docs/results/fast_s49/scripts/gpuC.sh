#!/bin/bash
# Session 49, call C: the decoder layer's last residual add inside down_proj's launch (skinny / float8 / 4-bit
# kernels' residual=), on the GPU: its bit-identity tests and the kernel files, then the 7B gate, HEAD (.fixtures/old,
# an archive of d015dfd, the session's start) against this code, alternating processes; the timeline if time is left.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_residual_epilogue.py tests/test_int4.py tests/test_fp8.py tests/test_skinny.py \
  -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED" $OUT/pytest.log
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192 --batches 1"
for i in 1 2; do
  PYTHONPATH=.fixtures/old timeout 60 python3 .fixtures/old/examples/bench_fast_7b.py $ARGS > $OUT/old_$i.log 2>&1
  echo "old $i: $(grep 'batch 1:' $OUT/old_$i.log | cut -c1-300)"
  timeout 60 python3 examples/bench_fast_7b.py $ARGS > $OUT/new_$i.log 2>&1
  echo "new $i: $(grep 'batch 1:' $OUT/new_$i.log | cut -c1-300)"
done
echo "at ${SECONDS}s"
if [ $SECONDS -lt 330 ]; then
  timeout $((450 - SECONDS)) python3 docs/results/fast_s49/scripts/timeline.py 5 > $OUT/timeline.log 2>&1
  echo "timeline rc=$?"; grep -A6 "^run " $OUT/timeline.log
fi
true
