#!/bin/bash
# Session 37, call G (what the budget left after call E): the GPU test files call E's time limit did not reach
# (test_tree_attention.py, test_inputs.py), then the fixture beside gpt-fast as session 31's call C ran it (plain,
# SpS K=8, prompt lookup K=10; 8 prompts) at the fixed code. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
B=${BUDGET:-380}
nvidia-smi --query-gpu=name --format=csv,noheader
# (session 38's call A sets TAIL_TESTS and TAIL_S for its own test list and reuses the rest)
timeout ${TAIL_S:-100} python3 -m pytest -q -rf -p no:cacheprovider ${TAIL_TESTS:-tests/test_tree_attention.py \
  tests/test_inputs.py} -k "not compiled" > $OUT/tail.log 2>&1
echo "tail rc=$? at ${SECONDS}s"; grep -a "^FAILED" $OUT/tail.log | head; tail -1 $OUT/tail.log
timeout $((B - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --num-prompts 8 --warmup 2 --max-seconds 8 --batches \
  --draft-k 8 --only "fast plain" "SpS K=8" "prompt lookup" --skip "level by level" "eager draft" \
  --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A8 "^batch method" $OUT/bm.log | head -9; grep -a "^- " $OUT/bm.log | tail -4
