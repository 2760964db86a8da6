#!/bin/bash
# Session 22, call C: GPU tests of the blocks, heads and fast path with the skinny kernel routed in; the 7B EAGLE-2
# (FR-Spec) step at batch 1 with --skinny-rows 0 / 16 alternating (four processes, 20 reps); the fixture's plain and
# SpS K=6 rows (a 7-row verify: the skinny kernel on small matrices) with 16 / 0; the step's profile (FR 8192).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_nn_inference.py \
  tests/test_decoder_ops.py tests/test_parallel_graphs.py tests/test_graphs.py \
  tests/test_draft_model_fast.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
mkdir -p $OUT/b7
for s in 0 16 0b 16b; do
  timeout 100 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 --skinny-rows ${s%b} --out $OUT/b7/s$s > $OUT/b7/s$s.log 2>&1
  echo "7b skinny=$s rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7/s$s.log | cut -d'|' -f2,5,17,20
done
F=.fixtures/fx
for s in 16 0; do
  timeout 100 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
    --data $F/pycode-heldout.jsonl --num-prompts 8 --warmup 2 --max-seconds 20 --batches --draft-k 6 \
    --only "fast plain" "SpS K=6" --skinny-rows ${s%b} --out $OUT/e/s$s > $OUT/b7/fx_s$s.log 2>&1
  echo "fixture skinny=$s rc=$? at ${SECONDS}s"; grep -a "^    1 " $OUT/b7/fx_s$s.log | head -4
done
SKINNY=16 FR=8192 timeout 100 python3 docs/results/fast_s16/scripts/prof_phase.py graphs > $OUT/b7/prof_fr.txt 2>&1
echo "profile rc=$? at ${SECONDS}s"; grep "^==" $OUT/b7/prof_fr.txt
(cd $OUT && tar czf b7.tgz b7 e && rm -r b7 e)
