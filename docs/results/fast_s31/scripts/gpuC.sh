#!/bin/bash
# Session 31, call C: with the n-gram kernel (specdec.kernels.ngram_chain): the GPU tests; the lookup A/B
# (eager drafter, graphed, folded; batch 1, 4, 16); then the fixture beside gpt-fast (plain, SpS K=8, lookup K=10).
# Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_prompt_lookup.py tests/test_graphs.py tests/test_gpu.py \
  tests/test_fast_path.py tests/test_kernels.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; tail -3 $OUT/tests.log
timeout 200 python3 docs/results/fast_s31/scripts/lookup_ab.py --fx $F --prompts 6 --reps 3 --batch 4 16 \
  --out $OUT/lookup.json > $OUT/lookup.log 2>&1
echo "lookup_ab rc=$? at ${SECONDS}s"
timeout $((590 - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --num-prompts 8 --warmup 2 --max-seconds 10 --batches \
  --draft-k 8 --only "fast plain" "SpS K=8" "prompt lookup" --skip "level by level" "eager draft" \
  --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A12 "^batch method" $OUT/bm.log | head -14
grep -v "Warn\|warn\|Loading" $OUT/lookup.log | tail -13
