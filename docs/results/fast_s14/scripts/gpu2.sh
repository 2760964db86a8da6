#!/bin/bash
# session 14 call 2: linear_skinny sweep against cuBLAS; the 7B step (graphs) with the tuned attention, skinny off/on.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 330 python3 .fixtures/tune_skinny.py 2>&1 | grep -v -i warn | tee $OUT/tune_skinny.txt
for s in 0 64; do
  SKINNY=$s timeout 90 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -24 > $OUT/prof_graphs_skinny$s.txt
  head -3 $OUT/prof_graphs_skinny$s.txt
done
