#!/bin/bash
# Session 27, call G: P-EAGLE and DFlash heads trained 100 s each (at once), then the fast step's phases of the
# trained and the random heads in one process (parallel_phases.py). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/G
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 150 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 100 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir $H/p > $OUT/G/tp.log 2>&1 &
timeout 150 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 90 --batch-size 32 \
  --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/d > $OUT/G/td.log 2>&1 &
wait; echo "trained at ${SECONDS}s"
timeout 150 python3 docs/results/fast_s27/scripts/parallel_phases.py --fx $F --peagle $H/p/peagle/final \
  --dflash $H/d/dflash/final --out $OUT/G/phases.json > $OUT/G/phases.log 2>&1
echo "phases rc=$? at ${SECONDS}s"; grep -a "call\|phases_ms" $OUT/G/phases.log | cut -c1-260
