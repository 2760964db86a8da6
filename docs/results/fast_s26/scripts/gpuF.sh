#!/bin/bash
# Session 26, call F: the 7B step at batch 1 and 4 (fast plain, EAGLE-2 with the float8 FR-Spec head) with this
# session's kernel changes (float8 launch configurations, packed top-k, narrower top-k chunks) and without
# (before_s26.py), alternating; then GPU tests of the drafters on the changed kernels.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/b7
for run in new old new2 old2; do
  pre=""; case $run in old*) pre="docs/results/fast_s26/scripts/before_s26.py";; esac
  timeout 80 python3 $pre examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 4 --reps 20 \
    --warmup 3 --draft-vocab 8192 --out $OUT/b7/$run > $OUT/b7/$run.log 2>&1
  echo "7b $run rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/$run.log | cut -d'|' -f2,5,18,22
done
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_topk.py tests/test_dynamic_tree_kernels.py \
  tests/test_eagle_drafter.py tests/test_fp8.py tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
