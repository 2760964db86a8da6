#!/bin/bash
# Session 32, call C (prepared for the next session; run after gpuB.sh): EAGLE's fold again, now that the verify step
# builds its mask inside its graph (session 30 kept EagleDrafter(fold=False) by default because the folded 7B step,
# timed from an idle device, waited for the host's input preparation: 6.26 / 6.38 against 5.81 / 5.82 ms). The fold
# on / off for EAGLE-2 / EAGLE-3 on the fixture (random heads, interleaved; session 30's fold_ab.py), then the 7B
# EAGLE-2 step with EagleDrafter(fold=True) and without, alternating processes, one step queued (the bench's
# default) and eight. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 150 python3 docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --methods EAGLE-2 EAGLE-3 --reps 4 \
  --out $OUT/fold_eagle.json > $OUT/fold_eagle.log 2>&1
echo "fold_ab rc=$? at ${SECONDS}s"; grep -v "Warn\|warn\|Loading" $OUT/fold_eagle.log | cut -c1-260 | tail -8
for queued in 1 8; do for fold in on off on off; do
  timeout 80 python3 -c "
import sys; sys.path.insert(0, 'examples')
import specdec.drafters.eagle as e
if '$fold' == 'on':
    init = e.EagleDrafter.__init__
    e.EagleDrafter.__init__ = lambda self, *a, **k: init(self, *a, **{**k, 'fold': True})
import bench_fast_7b
bench_fast_7b.main(['--only', 'fast_plain', 'fast_spec_fr8', '--batches', '1', '--reps', '20', '--warmup', '3',
                    '--queued', '$queued', '--draft-vocab', '8192'])" > $OUT/b7_q${queued}_$fold$SECONDS.log 2>&1
  echo "7b queued $queued fold $fold rc=$? at ${SECONDS}s"
  grep -h "^| [0-9]" $(ls -t $OUT/b7_q${queued}_$fold*.log | head -1) | cut -d'|' -f2,5,18,22
done; done
