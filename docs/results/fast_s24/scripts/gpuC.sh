#!/bin/bash
# Session 24, call C: where the plain step's time goes (profile), tree attention against the live keys, top-k
# chunking; the float8 tests (DFlash / DSpark lm_head copies included) and the parallel drafters' fast-path tests.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/fast_s24/scripts
timeout 100 python3 $S/attn_slope.py > $OUT/attn_slope.txt 2>&1; echo "slope rc=$? at ${SECONDS}s"
cat $OUT/attn_slope.txt | grep -v Warn
timeout 60 python3 $S/topk_bench.py > $OUT/topk.txt 2>&1; echo "topk rc=$? at ${SECONDS}s"; grep -v Warn $OUT/topk.txt
timeout 120 python3 $S/prof_plain.py > $OUT/prof_plain.txt 2>&1; echo "prof rc=$? at ${SECONDS}s"
grep -A16 "^==" $OUT/prof_plain.txt | cut -c1-120
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py tests/test_parallel_graphs.py \
  tests/test_fast_path.py -k "not compiled and (fp8 or dflash or dspark or peagle or parallel or medusa)" \
  > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
