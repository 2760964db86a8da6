#!/bin/bash
# Session 22, call A: the skinny kernel against cuBLASLt / cuBLAS per 7B / head matrix at 61, 10 and 7 rows (no
# weight copies: small matrices partly served from L2), 66 launch configurations each.
mkdir -p $OUT && nvidia-smi --query-gpu=name --format=csv,noheader && python docs/results/fast_s22/scripts/sweep_skinny.py --out $OUT/sweep.json --deadline 400 2>&1 | grep -v Warning | tee $OUT/sweep.txt
