#!/bin/bash
# Session 29, call B: the three parallel drafters' heads (P-EAGLE, DFlash, DSpark) trained at once for ~450 s each,
# then brought back in bfloat16 (the benchmark runs them in bf16; the loaders cast to the target's dtype) so that
# call C carries them with the fixture (64 MiB in all). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/t
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 545 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 450 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir $H/p > $OUT/t/tp.log 2>&1 &
timeout 545 python3 examples/train_dflash.py --method dspark $COMMON --steps 100000 --time-budget 450 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/s > $OUT/t/ts.log 2>&1 &
timeout 545 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 450 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/d > $OUT/t/td.log 2>&1 &
wait
echo "trained at ${SECONDS}s"; ls -d $H/*/*/final
python3 - <<'PY'
import glob, torch
from safetensors.torch import load_file, save_file
target = {}
for f in glob.glob(".fixtures/fx/pycoder-18m/*.safetensors"):
    target.update(load_file(f))
emb = next(v for k, v in target.items() if k.endswith("embed_tokens.weight"))
for f in glob.glob(".fixtures/heads/*/*/final/*.safetensors"):
    sd = load_file(f)
    e = sd.get("embed_tokens.weight")
    if e is not None and e.shape[0] > emb.shape[0] and torch.equal(e[:emb.shape[0]].to(emb.dtype), emb):
        # the target's own rows (frozen) and the mask row: keep only the mask row (the loader takes the target's)
        sd["mask_embedding"] = sd.pop("embed_tokens.weight")[emb.shape[0]:].reshape(-1)
        print("embedding = the target's: kept the mask row only", f)
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}, f)
    print("bf16", f)
PY
for f in tp ts td; do echo "== $f"; tr '\r' '\n' < $OUT/t/$f.log | grep -a "stopped\|level 1:\|level 2:\|saved" | tail -4; done
tar czf $OUT/p.tgz -C $H p/peagle/final; tar czf $OUT/ds.tgz -C $H d/dflash/final s/dspark/final
(cd $OUT && tar czf t.tgz t && rm -r t); ls -la $OUT
