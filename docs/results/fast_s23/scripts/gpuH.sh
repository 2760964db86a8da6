#!/bin/bash
# Session 23, call H: after linear_skinny and linear_fp8 came to share one streaming loop (skinny_accumulate /
# skinny_store): their GPU tests, and the 7B step once more (bf16 and float8 FR-Spec heads, batch 1).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py tests/test_skinny.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 100 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr fast_spec_fr8 --batches 1 --reps 20 \
  --warmup 3 --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "7b rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7.log | cut -d'|' -f2,5,17,18,21,22
