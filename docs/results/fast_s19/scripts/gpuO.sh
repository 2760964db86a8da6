#!/bin/bash
# Session 19, call O: every head trained at once (P-EAGLE given the longest budget: in call L, beside four other
# trainings, it reached 395 steps in 90 s and tau 1.35), then bench_fast with every drafter beside gpt-fast in one
# process, the parallel drafters also verifying Medusa's mc_sim_7b_63 tree of their levels' top-k
# (--parallel-tree). Carry .fixtures/fx (fixture, draft, anchors).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 240 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 160 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir /tmp/p > $OUT/tp.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dspark $COMMON --steps 100000 --time-budget 130 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir /tmp/s > $OUT/ts.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 90 --batch-size 32 \
  --seq-len 512 --block-size 8 --num-layers 2 --out-dir /tmp/d > $OUT/td.log 2>&1 &
timeout 240 python3 examples/train_medusa.py --method medusa1 $COMMON --steps 100000 --time-budget 90 \
  --calib-prompts 8 --out-dir /tmp/m > $OUT/tm.log 2>&1 &
timeout 240 python3 examples/train_eagle.py $COMMON --steps 1500 --methods eagle1 --out-dir /tmp/h > $OUT/te.log 2>&1 &
wait
for f in tp ts td tm te; do echo "== $f"; tail -c 400 $OUT/$f.log | tr '\r' '\n' | grep -av "^$" | tail -2; done
pkill -f examples/train_ ; sleep 1; echo "trained at ${SECONDS}s"
timeout $((560 - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle /tmp/p/peagle/final --dflash /tmp/d/dflash/final \
  --dspark /tmp/s/dspark/final --medusa /tmp/m/medusa --eagle2 /tmp/h/eagle1/final --num-prompts 8 --warmup 2 \
  --max-seconds 20 --batches --parallel-tree mc_sim_7b_63 \
  --only "fast plain" P-EAGLE DFlash DSpark Medusa EAGLE-2 --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A30 "^batch method" $OUT/bm.log | head -32
