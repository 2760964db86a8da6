#!/bin/bash
# Session 38, call C: the fast path's GPU tests at this session's code in one process (session 37's wrapper and
# lifetime changes after its call E were tested on the CPU only), then the 7B step at batch 1, 4 and 16 (plain,
# EAGLE-2 bf16, EAGLE-2 float8 FR-Spec) for the time left. No fixture needed.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
B=${BUDGET:-560}
nvidia-smi --query-gpu=name --format=csv,noheader
FILES="tests/test_fast_path.py tests/test_parallel_graphs.py tests/test_prompt_lookup.py tests/test_graphs.py
  tests/test_gpu.py tests/test_medusa_drafter.py tests/test_eagle_drafter.py"
timeout $((B * 3 / 5)) python3 -m pytest -q -rf -p no:cacheprovider $FILES -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -a "^FAILED\|^ERROR" $OUT/tests.log | head -20 | cut -c1-250
tail -1 $OUT/tests.log
timeout $((B - SECONDS - 10)) python3 examples/bench_fast_7b.py --batches 1 4 16 --only fast_plain fast_spec \
  fast_spec_fr8 --warmup 3 --reps 20 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "7b rc=$? at ${SECONDS}s"; grep -a "^|" $OUT/b7.log | head -8 | cut -c1-400
