#!/bin/bash
# Session 33, call B (prepared; after gpuA.sh): the host profile of the fixture's fast steps at this code (session 32's
# host_profile.py: per-kernel tables too) and the 7B step at batch 1 / 4 / 16. Then, as call C, session 32's gpuC.sh
# (EAGLE's fold on / off, fixture and 7B). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 100 python3 docs/results/fast_s32/scripts/host_profile.py --fx $F --out $OUT/host > $OUT/host.log 2>&1
echo "host_profile rc=$? at ${SECONDS}s"
timeout 150 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 16 --reps 20 --warmup 3 \
  --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "bench_fast_7b rc=$? at ${SECONDS}s"
grep -v "Warn\|warn\|Loading" $OUT/host.log | tail -4
grep -a "^| 1\|^| 4\|^| 16" $OUT/b7.log | tail -3
