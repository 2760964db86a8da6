#!/bin/bash
# Session 49, call D: the GPU tests of the kernels the session-48 review refactored after its last GPU run
# (decoder_inputs / table_rows through the shared clamped-row copy, d015dfd), then the fast path's identity tests,
# at the session's final code; counted from the verbose lines if the time limit cuts it.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 215 python3 -m pytest tests/test_decoder_ops.py tests/test_fast_path.py -p no:cacheprovider -v --tb=short \
  > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED" $OUT/pytest.log
echo "lines: $(grep -c " PASSED" $OUT/pytest.log) passed, $(grep -c " FAILED" $OUT/pytest.log) failed, $(grep -c " SKIPPED" $OUT/pytest.log) skipped"
