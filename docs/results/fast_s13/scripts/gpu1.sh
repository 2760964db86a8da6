#!/bin/bash
# session 13 call 1: tree_attention skips hidden tiles: kernel tests, microbench, 7B step profile; pending GPU tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_decode_attention.py \
  tests/test_topk.py > $OUT/t1.log 2>&1
echo "kernel tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
timeout 60 python3 .fixtures/bench_attn.py 2>&1 | grep -v -i warn | tee $OUT/attn.txt
timeout 100 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -34 | tee $OUT/prof_graphs.txt
timeout 230 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_parallel_graphs.py tests/test_peagle.py \
  tests/test_dflash.py tests/test_medusa_drafter.py -k "not compiled" > $OUT/t2.log 2>&1
echo "method tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t2.log | tail -12
