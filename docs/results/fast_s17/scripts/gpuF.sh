#!/bin/bash
# session 17 call F: FR-Spec on the fixture: an EAGLE-1 head, then EAGLE-2's tau against the draft vocabulary's size.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 110 python3 examples/train_eagle.py --target $F/pycoder-18m --data-dir $SP --max-files 20000 --steps 3000 \
  --device cuda --methods eagle1 --out-dir /tmp/h > $OUT/train1.log 2>&1
echo "train rc=$?"
timeout 120 python3 examples/ablate_draft_vocab.py --target $F/pycoder-18m --eagle1 /tmp/h/eagle1/final \
  --prompts $F/pycode-heldout.jsonl --corpus-dir $SP --max-files 2000 --sizes 8192 4096 2048 1024 512 \
  --num-prompts 6 --max-new-tokens 128 --device cuda --fast graphs --out $OUT/dv > $OUT/dv.log 2>&1
echo "ablate rc=$?"; grep -v -i "warn\|it/s\]" $OUT/dv.log | tail -7
