#!/bin/bash
# Session 36, call B: call A's GPU test failures (token identity of the fast path with SpS, prompt lookup, Medusa and
# the folded drafters; EAGLE-2 unfolded passed) run three ways: as they are, without programmatic dependent launch
# (SPECDEC_PDL=0), and with graphed drafters copying every input (-p no_in_place). Carry nothing.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/docs/results/fast_s36/scripts; mkdir -p $OUT
T=$(cat docs/results/fast_s36/scripts/failing_tests.txt)  # six of call A's failures
B=${BUDGET:-300}
timeout $((B * 2 / 5)) python3 -m pytest -q -p no:cacheprovider --tb=short $T > $OUT/as_is.log 2>&1
echo "as is rc=$? at ${SECONDS}s"; tail -8 $OUT/as_is.log | cut -c1-250
timeout $((B * 3 / 10)) env SPECDEC_PDL=0 python3 -m pytest -q -p no:cacheprovider --tb=line $T > $OUT/no_pdl.log 2>&1
echo "no PDL rc=$? at ${SECONDS}s"; tail -8 $OUT/no_pdl.log | cut -c1-250
timeout $((B - SECONDS)) python3 -m pytest -q -p no:cacheprovider -p no_in_place --tb=line $T > $OUT/copying.log 2>&1
echo "copying rc=$? at ${SECONDS}s"; tail -8 $OUT/copying.log | cut -c1-250
grep -a "^E " $OUT/as_is.log | head -30 | cut -c1-300
