#!/bin/bash
# session 12 call 1: GPU tests of the late-bound fixes; compiled EAGLE-3 (with topk_rows) beside gpt-fast, profiled.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_eagle_drafter.py \
  tests/test_draft_model_fast.py tests/test_topk.py tests/test_parallel_graphs.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -10
timeout 260 python3 examples/bench_fast_rounds.py --target $F/pycoder-18m --data $F/heldout40.jsonl --eagle3 $F/h16/e3 \
  --gptfast $F/anchors --num-prompts 6 --rounds 3 --mode compile --profile --out $OUT/rounds_c > $OUT/rounds_c.log 2>&1
echo "rounds compile rc=$?"; grep -v -i "warn\|Loading\|self.gen" $OUT/rounds_c.log | tail -30
