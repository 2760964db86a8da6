#!/bin/bash
# Session 28, call C (as session 27 call E, 30 s per timed loop; chains of 4 and prefetching rows too): every specdec method on the fast path beside gpt-fast in one process, at this session's code
# (session 21's call B plus EAGLE-3, SpS K = 4 / 6 and prompt lookup), on the heads of call B (.fixtures/heads on a
# warm machine, else unpacked from the carried .fixtures/back/heads.tgz). bf16, greedy, batch 1, 8 prompts.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads
[ -d $H/h3/eagle3/final ] || tar xzf .fixtures/back/heads.tgz
timeout 570 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle $H/p/peagle/final --dflash $H/d/dflash/final \
  --dspark $H/s/dspark/final --medusa $H/m/medusa --eagle2 $H/h/eagle1/final --eagle3 $H/h3/eagle3/final \
  --num-prompts 8 --warmup 2 --max-seconds 30 --batches --parallel-tree mc_sim_7b_63 --draft-k 4 6 8 --chain-k 4 --prefetch-rows \
  --only "fast plain" "SpS K=4" "SpS K=6" "prompt lookup" P-EAGLE DFlash DSpark Medusa EAGLE-2 EAGLE-3 \
  --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A40 "^batch method" $OUT/bm.log | head -42
