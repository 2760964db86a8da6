#!/bin/bash
# Not run (session 18 ended without device time): gpuH.sh again, now that bench_fast.py reports captures inside
# timed calls and each call's seconds, with a DSpark head trained beside the others and timed too (the one method
# never timed beside gpt-fast); then prof_parallel.py with the trained P-EAGLE head; then the GPU test of
# held_graphs. One call, ~570 s of the 600 allowed. Carry .fixtures (the fixture, draft and anchors; 43 MB).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 200 python3 examples/train_dflash.py --method dspark --target $F/pycoder-18m --data-dir $SP --max-files 4000 \
  --device cuda --steps 100000 --time-budget 90 --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 \
  --out-dir /tmp/s > $OUT/ts.log 2>&1 &   # runs beside gpuH.sh's four trainings
sed -e '/^LEFT=/,$d' -e 's|--medusa /tmp/m/medusa|--medusa /tmp/m/medusa --dspark /tmp/s/dspark/final|' \
  -e 's|Medusa EAGLE-2 --out|Medusa EAGLE-2 DSpark --out|' docs/results/fast_s18/scripts/gpuH.sh > /tmp/h.sh
timeout 450 bash /tmp/h.sh
grep -A12 "captured or rebuilt" $OUT/bg.log | head -14
timeout 70 python3 docs/results/fast_s18/scripts/prof_parallel.py $F /tmp/p/peagle/final > $OUT/prof.log 2>&1
echo "prof rc=$?"; grep "#####\|^==" $OUT/prof.log | head -16
timeout 45 python3 -m pytest -q tests/test_fast_path.py -k "held_graphs or reuses" > $OUT/t.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/t.log
