#!/bin/bash
# session 17 call C: the fixture, every method beside gpt-fast vanilla and gpt-fast SpS K=4,6 in one process (graphs).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
timeout 520 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --eagle3 .fixtures/e3 --num-prompts 14 --warmup 2 \
  --max-seconds 40 --batches --out $OUT/bf > $OUT/bf.log 2>&1
echo "bench_fast rc=$?"; grep -v -i "warn\|Loading\|self.gen\|it/s\]" $OUT/bf.log | tail -25
