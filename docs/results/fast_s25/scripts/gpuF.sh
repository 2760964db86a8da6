#!/bin/bash
# Session 25, call F: the GPU tests of programmatic dependent launch (a captured chain with and without it) and the
# CUDA-graph suite; the 7B step at batch 1 and 16 with everything of this session on (PDL, visible_end), twice.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py -k "pdl" tests/test_gpu.py \
  tests/test_graphs.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
mkdir -p $OUT/b7
for run in r1 r2; do
  timeout 90 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 16 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
