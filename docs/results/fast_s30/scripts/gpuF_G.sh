#!/bin/bash
# Session 30, calls F and G (run as inline commands; kept here to be rerun).
# F: kernel time of the 7B EAGLE-2 step with EagleDrafter(fold=True) against without (torch.profiler, 10 steps).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 200 python3 docs/results/fast_s30/scripts/fold_7b_prof.py > $OUT/fold_7b_prof.txt 2>&1
# G: the same steps queued 8 at a time (bench_fast_7b --queued 8), the EAGLE fold on and off, one process each.
for fold in on off; do timeout 80 python3 -c "
import sys; sys.path.insert(0, 'examples')
import specdec.drafters.eagle as e
if '$fold' == 'on':
    init = e.EagleDrafter.__init__
    e.EagleDrafter.__init__ = lambda self, *a, **k: init(self, *a, **{**k, 'fold': True})
import bench_fast_7b
bench_fast_7b.main(['--only', 'fast_plain', 'fast_spec_fr8', '--batches', '1', '--reps', '20', '--warmup', '3',
                    '--queued', '8', '--draft-vocab', '8192'])" > $OUT/b7q_$fold.log 2>&1
  grep "^| [0-9]" $OUT/b7q_$fold.log | cut -d'|' -f2,5,18,22; done
