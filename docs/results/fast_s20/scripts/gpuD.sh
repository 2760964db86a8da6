#!/bin/bash
# Session 20, call D: GPU tests of the fast path since session 19's last-step change (8af61df, 454d6ed: CPU-tested
# only), then the 7B step on today's main (FR-Spec 8192 and full vocabulary).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fast_path.py tests/test_parallel_graphs.py \
  tests/test_medusa_drafter.py -k "not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
timeout 200 python3 examples/bench_fast_7b.py --only fast_plain fast_spec fast_spec_fr --batches 1 4 16 --reps 10 \
  --warmup 3 --draft-vocab 8192 --out $OUT/b7 > $OUT/b7.log 2>&1
echo "bench 7b rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7.log | cut -d'|' -f2,4,13,17,19,20
(cd $OUT && ls b7 >/dev/null 2>&1 && tar czf b7.tgz b7 && rm -r b7)
