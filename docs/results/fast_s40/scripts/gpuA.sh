#!/bin/bash
# Session 40, call A (H100): the 64-row linear sweep with a TMA prototype (skinny40.py), the float8 head's launch
# sweep on this card (session 26's fp8_sweep.py), the tuning and skinny GPU tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout 330 python3 docs/results/fast_s40/scripts/skinny40.py $OUT/skinny40.json 270 > $OUT/skinny40.log 2>&1
echo "skinny40 rc=$? at ${SECONDS}s"
timeout 170 python3 docs/results/fast_s26/scripts/fp8_sweep.py --out $OUT/fp8_sweep.json --deadline 130 \
  --shapes qkv o gate_up down fc lm_fr > $OUT/fp8.log 2>&1
echo "fp8 rc=$? at ${SECONDS}s"
timeout 80 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tuning.py tests/test_skinny.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -4
grep -v "^  " $OUT/skinny40.log | head -60
cat $OUT/fp8.log | grep -v Warn | head -30
