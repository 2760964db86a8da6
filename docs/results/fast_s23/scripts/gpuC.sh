#!/bin/bash
# Session 23, call C: float8 draft heads (specdec.nn.quantize_fp8_, specdec.kernels.linear_fp8). GPU tests; the 7B
# EAGLE-2 step with the FR-Spec head in bf16 and rounded to float8, two processes.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py tests/test_skinny.py \
  tests/test_eagle_vocab.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/b7
for run in 1 2; do
  timeout 150 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/r$run > $OUT/b7/r$run.log 2>&1
  echo "7b run $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/r$run.log | cut -d'|' -f2,5,17,18,21,22
done
(cd $OUT && tar czf b7.tgz b7 && rm -r b7)
