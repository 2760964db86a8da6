#!/bin/bash
# session 13 call 3: plan rule; fast-path GPU tests with kv_end; 7B rows graphs (b 1 4 16) and compiled (b 1).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_draft_model_fast.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 60 python3 .fixtures/bench_attn.py 2>&1 | grep -v -i warn | tee $OUT/attn.txt
timeout 330 python3 examples/bench_fast_7b.py --only fast_plain fast_spec fast_plain_compiled fast_spec_compiled \
  --compile --compile-batches 1 --batches 1 4 16 --reps 10 --warmup 3 --out $OUT/b7 2>&1 | grep -v -i warn | tail -8
