#!/bin/bash
# Session 43, call C: the GPU test files call A's 300 s cut off (test_gpu.py, test_fast_path.py), at this code.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout ${T:-420} python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_fast_path.py "$@" \
  > $OUT/tests_fast.log 2>&1
echo "tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/tests_fast.log)"
grep -E "FAILED|Error" $OUT/tests_fast.log | head -20
