#!/bin/bash
# Session 25, call C: visible_end in the fast path (dense rows: no mask read for the committed slots). GPU tests
# (tree attention, the fused decoder, the fast path); the 7B EAGLE-2 step (FR-Spec 8192, float8 head) at batch 4
# and 16 with visible_end and without (novisible.py: prefix_end as in session 24), alternating.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 220 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_fused.py \
  tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/b7
for run in on off on2 off2; do
  pre=""; case $run in off*) pre="docs/results/fast_s25/scripts/novisible.py";; esac
  timeout 130 python3 $pre examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 4 16 --reps 10 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b visible $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
