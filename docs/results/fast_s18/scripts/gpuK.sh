#!/bin/bash
# session 18 call K: does P-EAGLE slow down only inside bench_fast.py's interleaving? A random-init P-EAGLE
# head (saved on the CPU), bench_fast rows interleaved per prompt, no gpt-fast (time).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
timeout 140 python3 examples/bench_fast.py --target $F/pycoder-18m --data .fixtures/rand/heldout12.jsonl \
  --peagle .fixtures/rand/peagle --num-prompts 5 --warmup 1 --max-seconds 20 \
  --batches --only "fast plain" P-EAGLE "prompt lookup" --out $OUT/bk > $OUT/bk.log 2>&1
echo "rc=$?"; grep "^    1 " $OUT/bk.log | head -8
