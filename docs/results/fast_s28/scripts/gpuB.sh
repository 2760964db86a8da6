#!/bin/bash
# Session 28, call B: the six fixture heads trained on the GPU (session 27's call D budgets) except P-EAGLE's, which
# trains for 380 s: alongside the others for their ~160 s, then alone. Kept in .fixtures/heads for call C (a warm
# machine). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/t
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 450 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 380 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir $H/p > $OUT/t/tp.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dspark $COMMON --steps 100000 --time-budget 130 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/s > $OUT/t/ts.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 90 --batch-size 32 \
  --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/d > $OUT/t/td.log 2>&1 &
timeout 240 python3 examples/train_medusa.py --method medusa1 $COMMON --steps 100000 --time-budget 90 \
  --calib-prompts 8 --out-dir $H/m > $OUT/t/tm.log 2>&1 &
timeout 240 python3 examples/train_eagle.py $COMMON --steps 1500 --methods eagle1 --out-dir $H/h > $OUT/t/te.log 2>&1 &
timeout 250 python3 examples/train_eagle.py $COMMON --steps 800 --save-every 400 --methods eagle3 --out-dir $H/h3 \
  > $OUT/t/t3.log 2>&1 &
wait
for f in tp ts td tm te t3; do echo "== $f"; tail -c 400 $OUT/t/$f.log | tr '\r' '\n' | grep -av "^$" | tail -2; done
echo "trained at ${SECONDS}s"; ls $H/*/
grep -a "level 1:\|level 2:\|steps" $OUT/t/tp.log | tail -4
(cd $OUT && tar czf t.tgz t && rm -r t)
