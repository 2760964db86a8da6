#!/bin/bash
# Session 26, call A: the verify's linears as a PDL chain (cuBLASLt vs the skinny kernel, with and without an L2
# prefetch of the weights before the wait); the 7B step at batch 1 with the prefetch on every product kernel and the
# 61-row verify on the skinny kernel; the GPU tests of the prefetch.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 290 python3 docs/results/fast_s26/scripts/chain_sweep.py --out $OUT/chain.json --deadline 170 \
  > $OUT/chain.log 2>&1
echo "chain rc=$? at ${SECONDS}s"; grep -v "^skinny\|failed" $OUT/chain.log | tail -30
mkdir -p $OUT/b7
for run in p0_s16 p2048_s16 p2048_s64; do
  p=${run%%_*}; p=${p#p}; s=${run##*_s}
  SPECDEC_L2_PREFETCH=$p timeout 75 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 \
    --reps 20 --warmup 3 --draft-vocab 8192 --skinny-rows $s --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_skinny.py tests/test_gemv.py \
  tests/test_kernel_compile.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
