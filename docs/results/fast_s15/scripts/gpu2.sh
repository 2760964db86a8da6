#!/bin/bash
# session 15 call 2: + log_softmax_topk (the dynamic tree's levels): GPU tests, 7B rows, profiles (graphs, dcompile).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 110 python3 examples/bench_fast_7b.py --only fast_plain fast_spec --batches 1 4 16 --reps 10 --warmup 3 \
  --out $OUT/b7 2>&1 | grep -v -i warn | tail -5
timeout 60 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -70 > $OUT/prof_graphs.txt
grep -h "step wall" $OUT/prof_graphs.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_topk.py tests/test_nn_inference.py \
  tests/test_eagle_drafter.py tests/test_fast_path.py tests/test_peagle.py tests/test_dflash.py -k "not compiled" \
  > $OUT/t2.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/t2.log | tail -8
timeout 220 python3 .fixtures/prof_7b.py dcompile 2>&1 | grep -v -i warn | head -70 > $OUT/prof_dcompile.txt
grep -h "step wall" $OUT/prof_dcompile.txt
