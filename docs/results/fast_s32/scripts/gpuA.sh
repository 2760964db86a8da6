#!/bin/bash
# Session 32, call A: the GPU tests at the session's first code (session 31's last commits, the narrow lookup on
# ngram_chain, never run on the GPU), then the host profile of fixture tree steps. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 150 python3 docs/results/fast_s32/scripts/host_profile.py --fx $F --out $OUT/host > $OUT/host.log 2>&1
echo "host_profile rc=$? at ${SECONDS}s"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_prompt_lookup.py tests/test_fast_path.py tests/test_graphs.py \
  tests/test_gpu.py -k "not compiled" -x > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
grep -v "Warn\|warn\|Loading" $OUT/host.log | tail -5
