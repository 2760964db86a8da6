#!/bin/bash
# Session 23, call A (and B, f8blk added): the draft head's linears on float8 tensor cores (both operands float8) against the bf16
# skinny kernel and torch._scaled_mm; 7B head shapes, 10 and 7 rows, weights cycled through 4 copies.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 400 python3 docs/results/fast_s23/scripts/fp8_native.py --rows 10 --deadline 330 --out $OUT/fp8.json 2>&1 \
  | grep -v Warning > $OUT/fp8.txt
echo "rc=$? at ${SECONDS}s"; cat $OUT/fp8.txt
