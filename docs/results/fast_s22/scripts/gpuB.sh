#!/bin/bash
# Session 22, call B: the tensor-core skinny linear (specdec.kernels.linear_skinny) routed into the draft heads'
# projections (2..16 rows) and the fused decoder's. GPU tests of the kernel and of the drafters/fast path on it; one
# 7B EAGLE-2 (FR-Spec) step at batch 1 with --skinny-rows 16 / 0 / 16 (one process each); a sweep of the kernel at
# a verify's 61 rows with the weights cycled through 4 copies (no L2 reuse), wider tiles.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_skinny.py tests/test_eagle_drafter.py \
  tests/test_gpu.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/b7
for s in 16 0 16b; do
  timeout 120 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr --batches 1 --reps 10 \
    --warmup 3 --draft-vocab 8192 --skinny-rows ${s%b} --out $OUT/b7/s$s > $OUT/b7/s$s.log 2>&1
  echo "7b skinny=$s rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/s$s.log | cut -d'|' -f2,5,17,20
done
(cd $OUT && tar czf b7.tgz b7 && rm -r b7)
timeout 150 python3 docs/results/fast_s22/scripts/sweep_skinny.py --rows 61 10 --copies 4 --wide --deadline 120 \
  --out $OUT/sweep61.json 2>&1 | grep -v Warning > $OUT/sweep61.txt
echo "sweep rc=$? at ${SECONDS}s"; cat $OUT/sweep61.txt
