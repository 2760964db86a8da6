#!/bin/bash
# Session 21, call E: the fixture's fast plain and SpS K=6 rows (draft model, no training needed) with the captures'
# GEMMs from cuBLASLt (the new default), cuBLAS, cuBLASLt again: one process each, 8 prompts, no gpt-fast.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
for lib in cublaslt cublas cublaslt2; do
  timeout 120 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
    --data $F/pycode-heldout.jsonl --num-prompts 8 --warmup 2 --max-seconds 20 --batches --draft-k 6 \
    --only "fast plain" "SpS K=6" --blas ${lib%2} --out $OUT/e/$lib > $OUT/e_$lib.log 2>&1
  echo "bench_fast $lib rc=$? at ${SECONDS}s"; grep -a "^    1 " $OUT/e_$lib.log | head -6
done
(cd $OUT && tar czf e.tgz e && rm -r e)
