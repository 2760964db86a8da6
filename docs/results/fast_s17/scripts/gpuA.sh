#!/bin/bash
# session 17 call A: train an EAGLE-3 head for the fixture; the fixture beside gpt-fast (graphs), whole generate calls.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 290 python3 examples/train_eagle.py --target $F/pycoder-18m --data-dir $SP --max-files 20000 --steps 3000 \
  --device cuda --methods eagle3 --out-dir /tmp/h > $OUT/train.log 2>&1
echo "train rc=$?"; tail -c 600 $OUT/train.log | tr '\r' '\n' | tail -3
mkdir -p $OUT/e3 && cp /tmp/h/eagle3/final/* $OUT/e3/ && ls -la $OUT/e3
timeout 240 python3 examples/bench_fast_rounds.py --target $F/pycoder-18m --data $F/pycode-heldout.jsonl \
  --eagle3 /tmp/h/eagle3/final --gptfast $F/anchors --num-prompts 6 --rounds 3 --mode graphs --out $OUT/rg \
  > $OUT/rg.log 2>&1
echo "rounds graphs rc=$?"; grep -v -i "warn\|Loading\|self.gen" $OUT/rg.log | tail -25
