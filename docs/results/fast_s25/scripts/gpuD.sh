#!/bin/bash
# Session 25, call D: programmatic dependent launch (PDL) for every specdec kernel. The 7B step at batch 1 (fast
# plain and EAGLE-2 with the float8 FR-Spec head) with PDL on (the default on the H200) and off (SPECDEC_PDL=0),
# alternating; then GPU tests of the kernels and the captured paths with PDL on.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/b7
for run in on off on2 off2; do
  case $run in off*) export SPECDEC_PDL=0;; *) unset SPECDEC_PDL;; esac
  timeout 70 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b pdl $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
unset SPECDEC_PDL
python3 -c "import specdec.kernels._triton as t; print('pdl on:', t.pdl_enabled())"
timeout 170 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_kernels_verify.py \
  tests/test_dynamic_tree_kernels.py tests/test_decoder_ops.py tests/test_fp8.py tests/test_decode_attention.py \
  tests/test_tree_attention.py tests/test_kernel_compile.py > $OUT/tests_kernels.log 2>&1
echo "kernel tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests_kernels.log | tail -6
timeout 180 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_eagle_drafter.py \
  tests/test_parallel_graphs.py -k "not compiled" > $OUT/tests_fast.log 2>&1
echo "fast tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests_fast.log | tail -6
