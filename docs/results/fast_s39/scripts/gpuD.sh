#!/bin/bash
# Session 39, call D: the verify's linears picked by timing (specdec.kernels.tuning) against F.linear always
# (--no-tune-linears), alternating processes; then the GPU tests of the change.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/b7
for run in on off on off; do
  flag=""; [ $run = off ] && flag="--no-tune-linears"
  timeout 100 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 $flag --out $OUT/b7/$run$SECONDS > $OUT/b7/$run$SECONDS.log 2>&1
  echo "tune $run rc=$? at ${SECONDS}s: $(grep '^| 1 ' $OUT/b7/$run*.log | tail -1 | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
grep -h "linear picks" $OUT/b7/on*.log | head -1 | cut -c1-400
timeout 280 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tuning.py tests/test_fused.py \
  tests/test_skinny.py tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
