#!/bin/bash
# Session 37, call F: session 30's call D (gpuD.sh) at session 37's fixed code: the fixture beside gpt-fast in one
# process, every specdec method, the six heads trained first in the same call (P-EAGLE 200 s, DFlash / DSpark 150 s,
# Medusa-1 70 s, EAGLE-1 1,200 steps, EAGLE-3 700). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/t
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 290 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 200 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir $H/p > $OUT/t/tp.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dspark $COMMON --steps 100000 --time-budget 150 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/s > $OUT/t/ts.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 150 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/d > $OUT/t/td.log 2>&1 &
timeout 200 python3 examples/train_medusa.py --method medusa1 $COMMON --steps 100000 --time-budget 70 \
  --calib-prompts 8 --out-dir $H/m > $OUT/t/tm.log 2>&1 &
timeout 220 python3 examples/train_eagle.py $COMMON --steps 1200 --methods eagle1 --out-dir $H/h > $OUT/t/te.log 2>&1 &
timeout 230 python3 examples/train_eagle.py $COMMON --steps 700 --save-every 350 --methods eagle3 --out-dir $H/h3 \
  > $OUT/t/t3.log 2>&1 &
wait
echo "trained at ${SECONDS}s"; ls -d $H/*/*/final $H/m/medusa
(cd $OUT && tar czf t.tgz t && rm -r t)
timeout $((590 - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle $H/p/peagle/final --dflash $H/d/dflash/final \
  --dspark $H/s/dspark/final --medusa $H/m/medusa --eagle2 $H/h/eagle1/final --eagle3 $H/h3/eagle3/final \
  --num-prompts 8 --warmup 2 --max-seconds 10 --batches --parallel-tree mc_sim_7b_63 --draft-k 4 8 --chain-k 4 \
  --only "fast plain" "SpS K=4" "SpS K=8" "prompt lookup" P-EAGLE DFlash DSpark Medusa EAGLE-2 EAGLE-3 \
  --skip "level by level" "eager draft" --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A40 "^batch method" $OUT/bm.log | head -42
