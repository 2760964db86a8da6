#!/bin/bash
# session 18 call J: a P-EAGLE head trained 60 s, then each parallel drafter's step on the fast path with
# eos_token_id=[] as bench_fast.py (random heads and the trained P-EAGLE head; host syncs counted).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 130 python3 examples/train_peagle.py --target $F/pycoder-18m --data-dir $SP --max-files 2000 --device cuda \
  --steps 100000 --time-budget 60 --batch-size 32 --seq-len 512 --max-drafts 8 --num-layers 2 --out-dir /tmp/p \
  > $OUT/tp.log 2>&1
echo "train rc=$?"; tail -c 300 $OUT/tp.log | tr '\r' '\n' | grep -v "^$" | tail -2
timeout 150 python3 docs/results/fast_s18/scripts/diag_parallel.py $F 4 128 /tmp/p/peagle/final > $OUT/diag.log 2>&1
echo "diag rc=$?"; grep -v -i "warn\|Loading" $OUT/diag.log | tail -9
