#!/bin/bash
# session 17 call B: the 7B step queued as generate() queues it, and with an FR-Spec draft vocabulary; GPU tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
for q in 8 1; do
  timeout 200 python3 examples/bench_fast_7b.py --only fast_plain fast_spec fast_spec_fr --batches 1 4 16 --reps 10 \
    --warmup 3 --queued $q --draft-vocab 8192 --out $OUT/b7_q$q > $OUT/b7_q$q.log 2>&1
  echo "bench queued $q rc=$?"; grep "^| [0-9]" $OUT/b7_q$q.log | cut -d'|' -f2,4,13,17,19,20
done
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_eagle_vocab.py tests/test_medusa_drafter.py \
  tests/test_parallel_graphs.py tests/test_draft_model_fast.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
