#!/bin/bash
# session 15 call 1: the draft heads' fused inference path (specdec/nn/inference.py): GPU tests, 7B rows, A/B profile.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 110 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -5
timeout 60 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -30 > $OUT/prof_graphs.txt
NOFUSE=1 timeout 60 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -30 > $OUT/prof_graphs_nofuse.txt
grep -h "step wall" $OUT/prof_graphs*.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_decoder_ops.py tests/test_nn_inference.py \
  tests/test_eagle_drafter.py tests/test_fast_path.py -k "not compiled" > $OUT/t1.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t1.log | tail -8
