#!/bin/bash
# Session 33, call B (prepared; after gpuA.sh): tree attention's merge inside the split kernel against its merge
# launch (a 32-call graph per shape, interleaved), the 7B step at batch 1 / 4 / 16, then the 7B step at batch 1 with the
# fused merge off / on in alternating processes (SPECDEC_TREE_FUSED_MERGE). Then, as call C, session 32's gpuC.sh
# (EAGLE's fold on / off, fixture and 7B); session 32's host_profile.py where time is left. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 90 python3 docs/results/fast_s33/scripts/fused_merge_ab.py --out $OUT/fused_merge.json > $OUT/fused_merge.log 2>&1
echo "fused_merge_ab rc=$? at ${SECONDS}s"
timeout 150 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 16 --reps 20 --warmup 3 \
  --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "bench_fast_7b rc=$? at ${SECONDS}s"
for fm in 0 1 0 1; do
  SPECDEC_TREE_FUSED_MERGE=$fm timeout 80 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 \
    --batches 1 --reps 20 --warmup 3 --draft-vocab 8192 > $OUT/b7_fm${fm}_$SECONDS.log 2>&1
  echo "7b fused merge $fm rc=$? at ${SECONDS}s"; grep -ah "^| 1 " $(ls -t $OUT/b7_fm${fm}_*.log | head -1) | tail -1
done
grep -v "Warn\|warn\|Loading" $OUT/fused_merge.log | cut -c1-300 | tail -4
grep -a "^| 1\|^| 4\|^| 16" $OUT/b7.log | tail -3
