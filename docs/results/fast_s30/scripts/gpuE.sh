#!/bin/bash
# Session 30, call E: EAGLE-1/2/3 folded too (their draft step reads the root positions the verify step makes).
# GPU tests; the fold on / off for EAGLE-2 / EAGLE-3 on the fixture (random heads, interleaved); the 7B step with the
# fold on and off, one process each. (Run while EAGLE's fold was on by default; it is opt-in since, EagleDrafter(fold=True):
# fold_ab.py sets it; the 7B loop below would need the same, as gpuF_G.sh does.)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_parallel_graphs.py tests/test_eagle_drafter.py \
  tests/test_fast_path.py -k "(fold or eagle or peagle or dflash) and not compiled" > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -6
timeout 150 python3 docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --methods EAGLE-2 EAGLE-3 --reps 4 \
  --out $OUT/fold_eagle.json > $OUT/fold_eagle.log 2>&1
echo "fold rc=$? at ${SECONDS}s"; grep -v "Warn\|warn\|Loading" $OUT/fold_eagle.log | cut -c1-260 | tail -8
for fold in on off on off; do
  timeout 80 python3 -c "
import sys; sys.path.insert(0, 'examples')
import specdec.graphs as g
if '$fold' == 'off':
    init = g.GraphedDrafter.__init__
    g.GraphedDrafter.__init__ = lambda self, *a, **k: init(self, *a, **{**k, 'fold': False})
import bench_fast_7b
bench_fast_7b.main(['--only', 'fast_plain', 'fast_spec_fr8', '--batches', '1', '--reps', '20', '--warmup', '3',
                    '--draft-vocab', '8192', '--out', '$OUT/b7_$fold$SECONDS'])" > $OUT/b7_$fold.log 2>&1
  echo "7b fold $fold rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7_$fold.log | cut -d'|' -f2,5,18,22
done
