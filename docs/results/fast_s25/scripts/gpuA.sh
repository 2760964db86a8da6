#!/bin/bash
# Session 25, call A: PDL in a graph of small kernels; tree attention with the tree's keys in a chunk of their own.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/fast_s25/scripts
timeout 150 python3 $S/pdl_probe.py $OUT/pdl_probe.json > $OUT/pdl_probe.txt 2>&1
echo "pdl rc=$? at ${SECONDS}s"; tail -13 $OUT/pdl_probe.txt
timeout 200 python3 $S/attn_chunk_sweep.py $OUT/attn_chunk.json > $OUT/attn_chunk.txt 2>&1
echo "attn rc=$? at ${SECONDS}s"; grep -v "^  fail" $OUT/attn_chunk.txt | tail -30; grep -c fail $OUT/attn_chunk.txt
