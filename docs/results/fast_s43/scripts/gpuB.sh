#!/bin/bash
# Session 43, call B: the 7B batch-1 gate, this session's drafter (RoPE rows from a table, draft ids mapped inside the
# top-k, the greedy walk from registers) against the code before it (.fixtures/old: `git archive c087547 specdec`), and
# att*: this session's code with the head-level attention plan of head_attn_plan.py; alternating processes.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p $OUT/b7
for run in "$@"; do
  case $run in old*) path=$PWD/.fixtures/old;; *) path=$PWD;; esac
  script=examples/bench_fast_7b.py; case $run in att*) script=docs/results/fast_s43/scripts/head_attn_plan.py;; esac
  PYTHONPATH=$path timeout ${T:-80} python3 $script --only fast_plain fast_spec_fr8 --batches 1 \
    --reps 20 --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "$run rc=$? at ${SECONDS}s: $(grep '^| 1 ' $OUT/b7/$run.log | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
