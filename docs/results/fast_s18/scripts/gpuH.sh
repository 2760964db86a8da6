#!/bin/bash
# session 18 call H (call G: the four trainings read 20,000 files each at once and their 150 s ran out after ~20 s of training): P-EAGLE, DFlash, Medusa-1 and EAGLE-1 heads for the fixture (trained concurrently, ~80 s each);
# then every one of them on the fast path beside gpt-fast vanilla and gpt-fast SpS K=4,6 in one process; then
# FR-Spec's tau on the fixture (EAGLE-2 against the draft vocabulary's size).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 200 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 90 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir /tmp/p > $OUT/tp.log 2>&1 &
timeout 200 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 90 --batch-size 32 \
  --seq-len 512 --block-size 8 --num-layers 2 --out-dir /tmp/d > $OUT/td.log 2>&1 &
timeout 200 python3 examples/train_medusa.py --method medusa1 $COMMON --steps 100000 --time-budget 90 \
  --calib-prompts 8 --out-dir /tmp/m > $OUT/tm.log 2>&1 &
timeout 200 python3 examples/train_eagle.py $COMMON --steps 1500 --methods eagle1 --out-dir /tmp/h > $OUT/te.log 2>&1 &
wait
for f in tp td tm te; do echo "== $f"; tail -c 400 $OUT/$f.log | tr '\r' '\n' | grep -v "^$" | tail -2; done
pkill -f examples/train_ ; sleep 1; nproc; uptime
ls /tmp/p/peagle /tmp/d/dflash /tmp/m /tmp/h/eagle1 2>&1 | tr '\n' ' '; echo
timeout 330 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle /tmp/p/peagle/final --dflash /tmp/d/dflash/final \
  --medusa /tmp/m/medusa --eagle2 /tmp/h/eagle1/final --num-prompts 8 --warmup 2 --max-seconds 20 --batches \
  --only "fast plain" P-EAGLE DFlash Medusa EAGLE-2 --out $OUT/bg > $OUT/bg.log 2>&1
echo "bench_fast rc=$?"; grep -v -i "warn\|Loading\|self.gen\|it/s\]" $OUT/bg.log | tail -16
LEFT=$((590 - SECONDS)); echo "ablate gets ${LEFT}s"
timeout $LEFT python3 examples/ablate_draft_vocab.py --target $F/pycoder-18m --eagle1 /tmp/h/eagle1/final \
  --prompts $F/pycode-heldout.jsonl --corpus-dir $SP --max-files 2000 --sizes 8192 4096 2048 1024 512 \
  --num-prompts 6 --max-new-tokens 128 --device cuda --fast graphs --out $OUT/dv > $OUT/dv.log 2>&1
echo "ablate rc=$?"; grep -v -i "warn\|it/s\]" $OUT/dv.log | tail -7
