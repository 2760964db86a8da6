"""Session 44: the verify's 64-row products with wider K chunks. Sessions 39-40 swept the skinny kernel with 64- and
128-element K chunks only (bf16: 128 or 256 contiguous bytes per weight row per load); here 256 and 512 (512 B and
1 KB per row), beside the tuning's picks and the one-row GEMV. 64 rows, bf16, 16 distinct weights cycled (HBM reads),
CUDA-graph replays (``captured_time_us``), us per linear.

    python docs/results/fast_s44/scripts/skinny_bk.py OUT.json
"""
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F

from specdec.kernels import linear_rows
from specdec.kernels.skinny import _linear_skinny_triton
from specdec.kernels.tuning import captured_time_us

dev, dt = "cuda", torch.bfloat16
t0 = time.time()
shapes = {"gate_up": (22016, 4096), "qkv": (12288, 4096), "down": (4096, 11008), "o": (4096, 4096),
          "lm_head": (32000, 4096)}
picks = {"gate_up": (64, 128, 1, 4, 5), "qkv": (128, 128, 1, 8, 3), "down": (64, 128, 2, 4, 4),
         "o": (64, 128, 1, 4, 5), "lm_head": (128, 128, 1, 8, 3)}
results = {}
for name, (n, k) in shapes.items():
    W = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(16 if name != "lm_head" else 6)]
    per = len(W)
    x = torch.randn(64, k, device=dev, dtype=dt)
    want = F.linear(x.float(), W[0].float())
    timed = lambda run: captured_time_us(run, 3, replays=10) / per  # noqa: E731
    row = {"cublaslt": timed(lambda: [F.linear(x, w) for w in W])}
    x1 = torch.randn(1, k, device=dev, dtype=dt)
    row["gemv1"] = timed(lambda: [linear_rows(x1, w) for w in W])
    splits = (1, 2) if n <= 4096 else (1,)
    cfgs = [picks[name]] + [c for c in itertools.product((64, 128), (256, 512), splits, (4, 8), (2, 3, 4))]
    cfgs += [(32, bk, s, 4, st) for bk in (256, 512) for s in splits for st in (3, 4)]
    sweep = {}
    for cfg in cfgs:
        fn = lambda w, c=cfg: _linear_skinny_triton(x, w, None, c)  # noqa: E731
        try:
            err = (fn(W[0]).float() - want).abs().max().item()
            if err > 0.05:
                print(f"  {name} {cfg} WRONG err {err}", flush=True)
                continue
            sweep[str(cfg)] = timed(lambda f=fn: [f(w) for w in W])
        except Exception as exc:  # noqa: BLE001
            if "OutOfResources" not in type(exc).__name__:
                print(f"  {name} {cfg} fail {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    gb = n * k * 2 / 1e9
    best = sorted(sweep.items(), key=lambda kv: kv[1])
    pick = sweep.get(str(picks[name]), float("nan"))
    print(f"== {name} [{n}x{k}] ({time.time() - t0:.0f}s, {len(sweep)} timed): cublaslt {row['cublaslt']:.1f} "
          f"gemv1 {row['gemv1']:.1f} ({gb / row['gemv1'] * 1e3:.2f} TB/s)  pick {picks[name]} {pick:.1f} "
          f"({gb / pick * 1e3:.2f} TB/s)", flush=True)
    for key, us in best[:5]:
        print(f"   {key:26s} {us:6.1f} us ({gb / us * 1e3:.2f} TB/s)", flush=True)
    results[name] = dict(row, sweep=sweep)
    W = None
    torch.cuda.empty_cache()
    json.dump(results, open(sys.argv[1], "w"), indent=1)
