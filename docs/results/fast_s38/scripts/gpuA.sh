#!/bin/bash
# Session 38, call A: session 37's call G again with the harness that times with the collector off and counts,
# per timed call, captures, rebuilds and Triton kernels loaded or compiled (to find session 37's one 0.74 s prompt
# lookup call); first the GPU tests session 37's calls did not reach. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; F=.fixtures/fx; mkdir -p $OUT
B=${BUDGET:-380}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -rf -p no:cacheprovider tests/test_inputs.py \
  "tests/test_fast_path.py::test_held_graphs_reports_the_stores_generate_keeps" > $OUT/tail.log 2>&1
echo "tail rc=$? at ${SECONDS}s"; grep -a "^FAILED" $OUT/tail.log | head; tail -1 $OUT/tail.log
timeout $((B - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --num-prompts 8 --warmup 2 --max-seconds 8 --batches \
  --draft-k 8 --only "fast plain" "SpS K=8" "prompt lookup" --skip "level by level" "eager draft" \
  --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A12 "^batch method" $OUT/bm.log | head -14; grep -a "^- " $OUT/bm.log | tail -4
