#!/bin/bash
# Session 43, call A: the GPU tests of the files this session touched (the drafter's RoPE table, the top-k's index
# map, the greedy walk reading from registers), then tree attention's launches swept with 128- and 256-key tiles (attn_sweep.py).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_topk.py tests/test_eagle_drafter.py \
  tests/test_eagle_vocab.py tests/test_kernels_verify.py tests/test_gpu.py tests/test_fast_path.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s: $(tail -1 $OUT/tests.log)"
timeout 240 python3 docs/results/fast_s43/scripts/attn_sweep.py $OUT/attn_sweep.json > $OUT/attn_sweep.log 2>&1
echo "sweep rc=$? at ${SECONDS}s"
grep -v "Warn\|warn" $OUT/attn_sweep.log | cut -c1-200
