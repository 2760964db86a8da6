#!/bin/bash
# Session 29, call A: the host's time per phase of the fast plain / P-EAGLE / DFlash steps (random heads), then
# the CPU side of one call under torch.profiler. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1; mkdir -p $OUT
timeout 400 python docs/results/fast_s29/scripts/host_split.py --fx .fixtures/fx --out $OUT/host.json > $OUT/host.log 2>&1
echo rc=$?; grep -v Loading $OUT/host.log | tail -100
