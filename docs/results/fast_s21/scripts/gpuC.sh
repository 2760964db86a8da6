#!/bin/bash
# Session 21, call C: captures now pick GEMMs from cuBLASLt by default (specdec.graphs.use_capture_blas). GPU tests
# of the captures and the fast path under it; cuBLAS against cuBLASLt at the batch-4 / batch-16 row counts; one 7B
# step at batches 1, 4, 16 with --blas cublaslt (the default), cublas, cublaslt again (one process each).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_decode_attention.py \
  tests/test_decoder_ops.py tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 90 python3 docs/results/fast_s21/scripts/bench_blas.py 4,16,244,976 > $OUT/blas_c.log 2>&1
echo "blas rc=$? at ${SECONDS}s"
mkdir -p $OUT/b7
for lib in cublaslt cublas cublaslt2; do
  timeout 170 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr --batches 1 4 16 --reps 10 \
    --warmup 3 --draft-vocab 8192 --blas ${lib%2} --out $OUT/b7/$lib > $OUT/b7/$lib.log 2>&1
  echo "7b $lib rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$lib.log | cut -d'|' -f2,5,11,17,20
done
(cd $OUT && tar czf b7.tgz b7 && rm -r b7)
grep "^M=\|^one" $OUT/blas_c.log
