#!/bin/bash
# session 16 call 4: the fixture beside gpt-fast on this session's code: an EAGLE-3 head trained here, then
# bench_fast_rounds in graphs mode (plain, EAGLE-3, gpt-fast vanilla) and compile mode (EAGLE-3, gpt-fast).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 250 python3 examples/train_eagle.py --target $F/pycoder-18m --data-dir $SP --max-files 8000 --steps 2000 \
  --device cuda --methods eagle3 --out-dir /tmp/h > $OUT/train.log 2>&1
echo "train rc=$?"; grep -v -i "warn" $OUT/train.log | tail -4; cp /tmp/h/summary.json $OUT/train_summary.json
timeout 120 python3 examples/bench_fast_rounds.py --target $F/pycoder-18m --data $F/pycode-heldout.jsonl \
  --eagle3 /tmp/h/eagle3/final --gptfast $F/anchors --num-prompts 6 --rounds 3 --mode graphs --out $OUT/rg \
  > $OUT/rounds_graphs.log 2>&1
echo "graphs rc=$?"; grep -v -i "warn\|Loading\|self.gen" $OUT/rounds_graphs.log | tail -7
timeout 200 python3 examples/bench_fast_rounds.py --target $F/pycoder-18m --data $F/pycode-heldout.jsonl \
  --eagle3 /tmp/h/eagle3/final --gptfast $F/anchors --num-prompts 6 --rounds 3 --mode compile --no-plain \
  --out $OUT/rc > $OUT/rounds_compile.log 2>&1
echo "compile rc=$?"; grep -v -i "warn\|Loading\|self.gen" $OUT/rounds_compile.log | tail -7
