#!/bin/bash
# Session 22, call D: the fixture's plain and SpS K=6 rows (a 7-row verify at batch 1: the skinny kernel on the
# 18M target's matrices) with --skinny-rows 0 / 16 alternating, four processes, 8 prompts each, no gpt-fast.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
mkdir -p $OUT/d
for s in 0 16 0b 16b; do
  timeout 100 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
    --data $F/pycode-heldout.jsonl --num-prompts 8 --warmup 2 --max-seconds 20 --batches --draft-k 6 \
    --only "fast plain" "SpS K=6" --skinny-rows ${s%b} --out $OUT/d/s$s > $OUT/d/fx_s$s.log 2>&1
  echo "fixture skinny=$s rc=$? at ${SECONDS}s"; grep -a "^    1 " $OUT/d/fx_s$s.log | head -3
done
(cd $OUT && tar czf d.tgz d && rm -r d)
