#!/bin/bash
# Session 25, call E: where programmatic dependent launch (PDL) shows. The 7B batch-1 step's host issue time against
# its device time (host_time.py), PDL on and off; the fixture (pycoder-18m, draft 4M; 8 prompts, last 256 prompt
# tokens, 128 new tokens, batch 1) plain and SpS K = 6 rows, PDL on and off. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
S=docs/results/fast_s25/scripts
for run in on off; do
  case $run in off*) export SPECDEC_PDL=0;; *) unset SPECDEC_PDL;; esac
  timeout 90 python3 $S/host_time.py > $OUT/host_$run.txt 2>&1
  echo "host $run rc=$? at ${SECONDS}s"; tail -3 $OUT/host_$run.txt
done
for run in on off; do
  case $run in off*) export SPECDEC_PDL=0;; *) unset SPECDEC_PDL;; esac
  timeout 150 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
    --data $F/pycode-heldout.jsonl --num-prompts 8 --draft-k 6 --warmup 2 --max-seconds 10 --batches \
    --only "fast plain" "SpS K=6" "prompt lookup" --out $OUT/fx_$run > $OUT/fx_$run.log 2>&1
  echo "fixture $run rc=$? at ${SECONDS}s"; grep -a -A9 "^batch method" $OUT/fx_$run.log | head -10
done
