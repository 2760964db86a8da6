#!/bin/bash
# Session 22, call F: is DSpark's bf16 sequence difference in call E (a prefetch-off run against the first run) from
# prefetch? DSpark alone, prefetch off, off, on, on.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
ORDER=0011 ONLY="DSpark 9" timeout 120 python3 docs/results/fast_s22/scripts/prefetch_parallel.py .fixtures/fx 4 2>&1 \
  | grep -v -a "Warn\|Loading" > $OUT/prefetch_f.txt
echo "rc=$? at ${SECONDS}s"; cat $OUT/prefetch_f.txt
