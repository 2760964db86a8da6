#!/bin/bash
# Session 20, call E: a second run of P-EAGLE's chain beside gpt-fast (call A was the first measured with the
# last-step fix). P-EAGLE alone trained 100 s (in call A it trained 160 s beside four other trainings), then
# bench_fast with fast plain and P-EAGLE (chain and mc_sim_7b_63 tree), 8 prompts. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 150 python3 examples/train_peagle.py --target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda \
  --steps 100000 --time-budget 100 --batch-size 32 --seq-len 512 --max-drafts 8 --num-layers 2 --out-dir /tmp/p \
  > $OUT/tp.log 2>&1
tail -c 300 $OUT/tp.log | tr '\r' '\n' | grep -av "^$" | tail -2; echo "trained at ${SECONDS}s"
timeout $((330 - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --peagle /tmp/p/peagle/final --num-prompts 8 --warmup 2 \
  --max-seconds 20 --parallel-tree mc_sim_7b_63 --only "fast plain" P-EAGLE --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A12 "^batch method" $OUT/bm.log | head -14
