#!/bin/bash
# session 15 call 3: the GPU tests call 2's 200 s did not reach (the heads' fused path in P-EAGLE, DFlash; Medusa,
# the parallel drafters' graphs, the draft model's fast path) and the compiled top-k tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 420 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_peagle.py tests/test_dflash.py \
  tests/test_medusa_drafter.py tests/test_parallel_graphs.py tests/test_draft_model_fast.py -k "not compiled" \
  > $OUT/t3.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3.log | tail -8
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_topk.py > $OUT/t3b.log 2>&1
echo "topk rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t3b.log | tail -4
