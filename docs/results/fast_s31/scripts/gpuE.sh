#!/bin/bash
# Session 31, call E: the GPU tests at the session's last code (a narrow lookup graphed as its fixed-width copy).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_prompt_lookup.py tests/test_graphs.py tests/test_gpu.py \
  tests/test_parallel_graphs.py tests/test_fast_path.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
