#!/bin/bash
# The 7B batch-1 gate (fast plain step against the EAGLE-2 step with the float8 FR-Spec head) in one process per run,
# alternating: runs named off* pass --no-tune-linears. Prints each run's plain ms, EAGLE-2 ms and ratio, then the
# linear picks of the first run. Used by sessions 39 (call E) and 40 (call D).
#   bash docs/results/alternate_7b.sh OUTDIR RUN...      (T=seconds per run, default 110)
dir=$1; shift
mkdir -p "$dir"
for run in "$@"; do
  flag=""; case $run in off*) flag="--no-tune-linears";; esac
  timeout "${T:-110}" python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 --batches 1 --reps 20 \
    --warmup 3 --draft-vocab 8192 $flag --out "$dir/$run" > "$dir/$run.log" 2>&1
  echo "$run rc=$? at ${SECONDS}s: $(grep '^| 1 ' "$dir/$run.log" | awk -F'|' '{print "plain", $5, "eagle2 fr8", $18, "ratio", $22}')"
done
grep -h "linear picks" "$dir/$1.log" | cut -c1-500
