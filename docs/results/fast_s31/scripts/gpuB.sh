#!/bin/bash
# Session 31, call B: after the batch-size fix of the fold's templates: the GPU tests again (prompt lookup, graphs,
# the parallel drafters' folds), the lookup A/B at batch 1, 4 and 16, and the host profile of a folded lookup step.
# Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_prompt_lookup.py tests/test_graphs.py tests/test_gpu.py \
  tests/test_parallel_graphs.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
timeout 200 python3 docs/results/fast_s31/scripts/lookup_ab.py --fx $F --prompts 6 --reps 3 --batch 4 16 \
  --out $OUT/lookup.json > $OUT/lookup.log 2>&1
echo "lookup_ab rc=$? at ${SECONDS}s"
timeout 150 python3 docs/results/fast_s31/scripts/host_profile.py --fx $F --out $OUT/host > $OUT/host.log 2>&1
echo "host_profile rc=$? at ${SECONDS}s"; grep -v "Warn\|warn\|Loading" $OUT/host.log | tail -3
grep -v "Warn\|warn\|Loading" $OUT/lookup.log | tail -13
