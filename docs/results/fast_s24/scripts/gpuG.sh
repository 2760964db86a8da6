#!/bin/bash
# Session 24, call G: tree attention's shared-prefix reads in the fast path. GPU tests (tree attention, the fast
# path, the fused decoder); the 7B EAGLE-2 step (FR-Spec 8192, float8 head) at batch 4 and 16 with the prefix read
# as one mask row and without (noprefix.py), alternating; batch 1 (where it is not used) once.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_fused.py \
  tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/b7
for run in on off on2 off2; do
  pre=""; case $run in off*) pre="docs/results/fast_s24/scripts/noprefix.py";; esac
  timeout 130 python3 $pre examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 4 16 --reps 10 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b prefix $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
