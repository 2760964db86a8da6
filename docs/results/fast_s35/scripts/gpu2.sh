#!/bin/bash
# Session 35, call 2 (prepared; after gpu1.sh): tree attention's launch plans for the 7B shapes (attn_configs_ab.py: the
# default two launches, the merge fused, one-launch plans without a key split), then the 7B step at batch 4 and 16
# with the fused merge off / on (ab_7b.py, one process, interleaved), then batch 1 again with every variant.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 120 python3 docs/results/fast_s35/scripts/attn_configs_ab.py --out $OUT/attn_configs.json \
  > $OUT/attn_configs.log 2>&1
echo "attn_configs_ab rc=$? at ${SECONDS}s"
timeout 220 python3 docs/results/fast_s35/scripts/ab_7b.py --batches 4 16 --rounds 4 --reps 6 \
  --variants fm0_fold0 fm1_fold0 direct_fold0 --out $OUT/ab_7b_b4_16.json > $OUT/ab_7b_b4_16.log 2>&1
echo "ab_7b b4/16 rc=$? at ${SECONDS}s"
timeout $((580 - SECONDS)) python3 docs/results/fast_s35/scripts/ab_7b.py --batches 1 --rounds 8 --reps 10 --variants fm0_fold0 fm1_fold0 fm0_fold1 fm1_fold1 direct_fold0 \
  --out $OUT/ab_7b_b1_again.json > $OUT/ab_7b_b1_again.log 2>&1
echo "ab_7b b1 again rc=$? at ${SECONDS}s"
grep -v "Warn\|warn\|Loading" $OUT/attn_configs.log | cut -c1-600 | tail -4
grep -a "^|" $OUT/ab_7b_b4_16.log $OUT/ab_7b_b1_again.log | cut -c1-200
