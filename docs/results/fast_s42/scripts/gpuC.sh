#!/bin/bash
# Session 42, call C (one GPU, no fixture, ~7 min): the 7B batch-1 gate in alternating processes, the verify's
# linears tuned as landed (on*) and with the tuning kept to the skinny kernel's launches (sk*: qkv and o_proj off
# cuBLASLt, every projection in the chain of PDL launches; force_skinny.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT/b7
nvidia-smi --query-gpu=name --format=csv,noheader
for run in on1 sk1 on2 sk2; do
  prog=examples/bench_fast_7b.py; case $run in sk*) prog=docs/results/fast_s42/scripts/force_skinny.py;; esac
  timeout 110 python3 $prog --only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192 \
    --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "$run rc=$? at ${SECONDS}s: $(grep '^| 1 ' $OUT/b7/$run.log | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
grep -h "linear picks" $OUT/b7/on1.log $OUT/b7/sk1.log | cut -c1-400
