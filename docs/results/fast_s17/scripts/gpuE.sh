#!/bin/bash
# session 17 call E: P-EAGLE and DFlash heads for the fixture (80 s each, concurrently); fast P-EAGLE / DFlash
# beside gpt-fast vanilla and SpS in one process.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 125 python3 examples/train_peagle.py --target $F/pycoder-18m --data-dir $SP --max-files 20000 --steps 100000 \
  --time-budget 80 --batch-size 32 --seq-len 512 --max-drafts 8 --num-layers 2 --device cuda --out-dir /tmp/p \
  > $OUT/tp.log 2>&1 &
timeout 125 python3 examples/train_dflash.py --method dflash --target $F/pycoder-18m --data-dir $SP --max-files 20000 \
  --steps 100000 --time-budget 80 --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --device cuda \
  --out-dir /tmp/d > $OUT/td.log 2>&1 &
wait
tail -c 300 $OUT/tp.log | tr '\r' '\n' | tail -2; tail -c 300 $OUT/td.log | tr '\r' '\n' | tail -2
timeout 185 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle /tmp/p/peagle/final --dflash /tmp/d/dflash/final \
  --num-prompts 8 --warmup 2 --max-seconds 25 --batches --only P-EAGLE DFlash --out $OUT/bf3 > $OUT/bf3.log 2>&1
echo "bench_fast rc=$?"; grep -v -i "warn\|Loading\|self.gen\|it/s\]" $OUT/bf3.log | tail -8
