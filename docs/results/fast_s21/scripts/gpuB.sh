#!/bin/bash
# Session 21, call B: bench_fast with every drafter beside gpt-fast in one process (session 19's gpuO.sh bench,
# unchanged but for --draft-k 4 6 8: gpt-fast's SpS at K = 8 too, the parallel drafters' chain length), on the
# heads call A trained (.fixtures/heads, kept on the warm machine, else unpacked from the carried heads.tgz).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads
[ -d $H/h/eagle1/final ] || tar xzf .fixtures/back/heads.tgz
ls $H/*/
timeout 570 python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle $H/p/peagle/final --dflash $H/d/dflash/final \
  --dspark $H/s/dspark/final --medusa $H/m/medusa --eagle2 $H/h/eagle1/final --num-prompts 8 --warmup 2 \
  --max-seconds 20 --batches --parallel-tree mc_sim_7b_63 --draft-k 4 6 8 \
  --only "fast plain" P-EAGLE DFlash DSpark Medusa EAGLE-2 --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A30 "^batch method" $OUT/bm.log | head -32
