#!/bin/bash
# session 15 call 4: the remaining CUDA tests (graphs vs eager drafts, the fused decoder, tree attention, generate)
# and the compiled fast-path tests (log_softmax_topk as a custom op inside torch.compile).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu.py tests/test_graphs.py tests/test_fused.py \
  tests/test_tree_attention.py tests/test_generate.py tests/test_decode_attention.py > $OUT/t4.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t4.log | tail -8
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_eagle_drafter.py \
  -k "compiled" > $OUT/t4c.log 2>&1
echo "compiled rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t4c.log | tail -8
