#!/bin/bash
# session 17 call D: an EAGLE-1 head for the fixture; fast EAGLE-2 and EAGLE-3 beside gpt-fast vanilla and SpS.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 170 python3 examples/train_eagle.py --target $F/pycoder-18m --data-dir $SP --max-files 20000 --steps 3000 \
  --device cuda --methods eagle1 --out-dir /tmp/h > $OUT/train1.log 2>&1
echo "train rc=$?"; tail -c 300 $OUT/train1.log | tr '\r' '\n' | tail -2
timeout 330 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --eagle2 /tmp/h/eagle1/final --eagle3 .fixtures/e3 \
  --num-prompts 14 --warmup 2 --max-seconds 40 --batches --only EAGLE --out $OUT/bf2 > $OUT/bf2.log 2>&1
echo "bench_fast rc=$?"; grep -v -i "warn\|Loading\|self.gen\|it/s\]" $OUT/bf2.log | tail -12
