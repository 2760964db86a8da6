#!/bin/bash
# session 12 call 3: tree_attention + chunked topk_rows: GPU tests, microbenchmarks, 7B step profile, fixture rounds.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_tree_attention.py tests/test_topk.py \
  tests/test_decoder_ops.py tests/test_decode_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -10
timeout 60 python3 $F/bench_attn.py 2>&1 | grep -v -i warn | tee $OUT/attn.txt
timeout 120 python3 $F/prof_7b.py graphs tree 2>&1 | grep -v -i warn | head -24 | tee $OUT/prof_graphs_tree.txt
timeout 280 python3 examples/bench_fast_rounds.py --target $F/pycoder-18m --data $F/heldout40.jsonl --eagle3 $F/h16/e3 \
  --gptfast $F/anchors --num-prompts 6 --rounds 3 --mode compile --no-plain --tree-attention on --profile \
  --out $OUT/rounds_ct > $OUT/rounds_ct.log 2>&1
echo "rounds compile tree rc=$?"; grep -v -i "warn\|Loading\|self.gen" $OUT/rounds_ct.log | tail -5
