#!/bin/bash
# Session 40, call C (H100): the fast path's GPU tests at the landed tuning code, torch.compile'd ones included;
# the batch-16 opt-in A/B (session 35's ab_7b.py) that ran out of memory on an 80 GB card in session 38, now with
# expandable segments and, if it still does not fit, two variants per process.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 290 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_tuning.py \
  tests/test_fused.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 200 python3 docs/results/fast_s35/scripts/ab_7b.py --batches 16 --rounds 4 --reps 6 \
  --variants fm0_fold0 fm1_fold0 direct_fold0 --out $OUT/ab16.json > $OUT/ab16.log 2>&1
rc=$?; echo "ab16 rc=$rc at ${SECONDS}s"
if [ $rc -ne 0 ]; then
  for v in fm1_fold0 direct_fold0; do
    timeout 110 python3 docs/results/fast_s35/scripts/ab_7b.py --batches 16 --rounds 3 --reps 6 \
      --variants fm0_fold0 $v --out $OUT/ab16_$v.json > $OUT/ab16_$v.log 2>&1
    echo "ab16 $v rc=$? at ${SECONDS}s"; grep "^|\|round" $OUT/ab16_$v.log
  done
fi
grep "^|\|round" $OUT/ab16.log
