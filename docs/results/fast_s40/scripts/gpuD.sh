#!/bin/bash
# Session 40, call D: the 7B batch-1 gate with the linear tuning, tuned / not tuned in alternating processes, the
# picks, and the tuning GPU test, on whichever card came (asked for an H200: the last H200 figure is session 30's).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p $OUT/b7
for run in on1 off1 on2; do
  flag=""; case $run in off*) flag="--no-tune-linears";; esac
  timeout 110 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 $flag --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "$run rc=$? at ${SECONDS}s: $(grep '^| 1 ' $OUT/b7/$run.log | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
grep -h "linear picks" $OUT/b7/on1.log | cut -c1-500
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tuning.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -4
