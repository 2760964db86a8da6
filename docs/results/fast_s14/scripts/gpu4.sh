#!/bin/bash
# session 14 call 4: the 7B step profile at batch 16 (graphs) and batch 1 with the drafter compiled (best pairing).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
ROWS=16 timeout 120 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | head -24 | tee $OUT/prof_graphs_b16.txt
timeout 300 python3 .fixtures/prof_7b.py dcompile 2>&1 | grep -v -i warn | head -45 > $OUT/prof_dcompile.txt
head -3 $OUT/prof_dcompile.txt
