#!/bin/bash
# Session 26, call E: the float8 head's products with the new launch configurations (and the full 32,000-row lm_head);
# top-k with packed keys against two reductions per pick, over chunk widths; GPU tests of both; the 7B step at batch 1.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 docs/results/fast_s26/scripts/fp8_sweep.py --out $OUT/fp8_sweep.json --rows 10 --deadline 100 \
  --shapes qkv gate_up lm_fr o lm > $OUT/fp8_sweep.log 2>&1
echo "fp8 rc=$? at ${SECONDS}s"; grep rows $OUT/fp8_sweep.log
timeout 120 python3 docs/results/fast_s26/scripts/topk_sweep.py --out $OUT/topk.json > $OUT/topk.log 2>&1
echo "topk rc=$? at ${SECONDS}s"; tail -5 $OUT/topk.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_topk.py tests/test_fp8.py \
  tests/test_dynamic_tree_kernels.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
