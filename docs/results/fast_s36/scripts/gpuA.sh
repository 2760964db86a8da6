#!/bin/bash
# Session 36, call A (one call of at most ~570 s, for a short device budget): the GPU tests at this code (sessions
# 32-35's changes), the 7B step's opt-ins at batch 1 in one process (ab_7b.py; prints a line per round, so a timeout
# keeps the rounds done), then tree attention's launch plans (attn_configs_ab.py, with session 36's key-split plans).
# Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
B=${BUDGET:-565}  # seconds this call may take in all
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout $((B * 2 / 5)) python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_parallel_graphs.py tests/test_medusa_drafter.py tests/test_prompt_lookup.py \
  tests/test_graphs.py tests/test_gpu.py tests/test_tree_attention.py tests/test_inputs.py -k "not compiled" \
  > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -a "^FAILED\|^ERROR" $OUT/tests.log | head -20 | cut -c1-250; tail -1 $OUT/tests.log
t=$((B * 4 / 5 - SECONDS)); t=$((t > 220 ? 220 : t))
timeout $t python3 docs/results/fast_s35/scripts/ab_7b.py --batches 1 --rounds 5 --reps 8 \
  --variants fm0_fold0 fm1_fold0 fm0_fold1 direct_fold0 --out $OUT/ab_7b_b1.json > $OUT/ab_7b_b1.log 2>&1
echo "ab_7b b1 rc=$? at ${SECONDS}s"
left=$((B - SECONDS))
if [ $left -gt 40 ]; then
  timeout $left python3 docs/results/fast_s35/scripts/attn_configs_ab.py --reps 60 --out $OUT/attn_configs.json \
    > $OUT/attn_configs.log 2>&1
  echo "attn_configs rc=$? at ${SECONDS}s"
fi
grep -a "round\|^|" $OUT/ab_7b_b1.log | cut -c1-250
grep -v "Warn\|warn" $OUT/attn_configs.log | cut -c1-1500 | tail -3
