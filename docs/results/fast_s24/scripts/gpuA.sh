#!/bin/bash
# Session 24, call A: tree attention's one-launch merge. GPU tests of the attention kernels; the sweep
# (attn_sweep.py); the 7B EAGLE-2 step (FR-Spec 8192, float8 head) with the merge in the launch and without.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_decode_attention.py \
  > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 240 python3 docs/results/fast_s24/scripts/attn_sweep.py $OUT/attn_sweep.json > $OUT/attn_sweep.txt 2>&1
echo "sweep rc=$? at ${SECONDS}s"; grep -v "^  .*fused=.*err" $OUT/attn_sweep.txt | tail -5
grep -A6 "^==" $OUT/attn_sweep.txt | head -40
mkdir -p $OUT/b7
for run in on off; do
  pre=""; [ $run = off ] && pre="docs/results/fast_s24/scripts/nomerge.py"
  timeout 110 python3 $pre examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b merge $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log
done
