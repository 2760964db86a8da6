"""Session 40: can a 64-row linear on an H100 stream the 7B verify's weights at the one-row GEMV's rate?

Candidates per matrix (64 rows, bf16, 16 distinct weights cycled so the weights come from HBM, CUDA-graph replays
through ``captured_time_us``; us per linear): cuBLASLt ``F.linear``, the one-row GEMV (the floor we compare to),
the pointer-load skinny kernel over a wider sweep than session 39's (BLOCK_N 256: fewer re-reads of the rows from
L2; K split 3), and a prototype of the same loop on TMA tensor descriptors (``w_desc.load``: the copy engine fills
shared memory; rows past M and columns past K read as zeros).

    python docs/results/fast_s40/scripts/skinny40.py $OUT/skinny40.json [deadline_s]

As run in call B. Call A's version also looped with ``tl.range(..., warp_specialize=WS)`` and listed eight
warp-specialised TMA launches last (``WS=True``); it printed nothing in 330 s (no per-launch progress then) and was
cut; the ``WS`` parameter is left unused here.
"""
import faulthandler
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from specdec.kernels import linear_rows
from specdec.kernels.skinny import _linear_skinny_triton, _skinny_reduce_kernel, skinny_store
from specdec.kernels.tuning import captured_time_us

out_path = sys.argv[1]
deadline = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
t0 = time.time()
faulthandler.dump_traceback_later(45, repeat=True)
dev, dt = "cuda", torch.bfloat16


@triton.jit
def _skinny_tma_kernel(x_desc, w_desc, b_ptr, y_ptr, M, N, K_PER_SPLIT, stride_ym, stride_ys,
                       HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, WS: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    k0 = pid_k * K_PER_SPLIT
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kk in range(k0, k0 + K_PER_SPLIT, BLOCK_K):
        w = w_desc.load([n0, kk])
        x = x_desc.load([0, kk])
        acc = tl.dot(w, tl.trans(x), acc)
    n = n0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    skinny_store(acc, b_ptr, y_ptr, n, m, n < N, m < M, pid_k, stride_ym, stride_ys, HAS_BIAS, SPLIT)


def linear_tma(x, w, cfg):
    bn, bk, split, warps, stages, ws = cfg
    rows, k = x.shape
    n = w.shape[0]
    bm = max(16, triton.next_power_of_2(rows))
    kps = -(-k // (split * bk)) * bk
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    target = y if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=x.device)
    xd = TensorDescriptor.from_tensor(x, [bm, bk])
    wd = TensorDescriptor.from_tensor(w, [bn, bk])
    _skinny_tma_kernel[(-(-n // bn), split)](xd, wd, w, target, rows, n, kps, n, rows * n if split > 1 else 0,
                                             HAS_BIAS=False, SPLIT=split, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, WS=ws,
                                             num_warps=warps, num_stages=stages)
    if split > 1:
        _skinny_reduce_kernel[(-(-(rows * n) // 1024),)](target, w, y, rows * n, n, rows * n, HAS_BIAS=False,
                                                         SPLIT=split, BLOCK=1024, num_warps=4)
    return y


def timed(run, per):
    return captured_time_us(run, 3, replays=10) / per


shapes = {"gate_up": (22016, 4096), "qkv": (12288, 4096), "down": (4096, 11008), "o": (4096, 4096),
          "lm_head": (32000, 4096)}
ptr_cfgs = ([(64, 128, 1, 4, 5), (64, 128, 2, 4, 5), (64, 128, 2, 4, 4), (64, 128, 1, 4, 4)]
            + list(itertools.product((128,), (64, 128), (1, 2, 3), (4, 8), (3, 5)))
            + [(256, 64, s, 8, st) for s in (1, 2, 3) for st in (3, 4, 5)]
            + [(256, 128, s, 8, st) for s in (1, 2, 3) for st in (2, 3)])
tma_cfgs = ([(64, bk, s, 4, st, False) for bk in (64, 128) for s in (1, 2) for st in (4, 6)]
            + [(*c, False) for c in itertools.product((128,), (64, 128), (1, 2, 3), (4, 8), (3, 5))]
            + [(256, 64, s, 8, st, False) for s in (1, 2, 3) for st in (3, 5)])
results = {}
for name, (n, k) in shapes.items():
    budget_end = t0 + deadline
    W = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(16 if name != "lm_head" else 6)]
    per = len(W)
    x = torch.randn(64, k, device=dev, dtype=dt)
    want = F.linear(x.float(), W[0].float())
    row = {"cublaslt": timed(lambda: [F.linear(x, w) for w in W], per)}
    x1 = torch.randn(1, k, device=dev, dtype=dt)
    row["gemv1"] = timed(lambda: [linear_rows(x1, w) for w in W], per)
    sweep = {}
    for kind, cfgs in (("ptr", ptr_cfgs), ("tma", tma_cfgs)):
        for cfg in cfgs:
            if time.time() > budget_end:
                break
            fn = (lambda w, c=cfg: _linear_skinny_triton(x, w, None, c)) if kind == "ptr" else \
                (lambda w, c=cfg: linear_tma(x, w, c))
            try:
                err = (fn(W[0]).float() - want).abs().max().item()
                if err > 0.05:
                    print(f"  {name} {kind} {cfg} WRONG err {err}", flush=True)
                    continue
                sweep[f"{kind} {cfg}"] = timed(lambda f=fn: [f(w) for w in W], per)
                print(f"  {name} {kind} {cfg} {sweep[f'{kind} {cfg}']:.1f} [{time.time() - t0:.0f}s]", flush=True)
                faulthandler.dump_traceback_later(45, repeat=True)
            except Exception as exc:  # noqa: BLE001
                if "OutOfResources" not in type(exc).__name__:
                    print(f"  {name} {kind} {cfg} fail {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    best = sorted(sweep.items(), key=lambda kv: kv[1])
    gb = n * k * 2 / 1e9
    print(f"== {name} [{n}x{k}] ({time.time() - t0:.0f}s, {len(sweep)} launches timed): cublaslt {row['cublaslt']:.1f} "
          f"gemv1 {row['gemv1']:.1f} ({gb / row['gemv1'] * 1e3:.2f} TB/s)", flush=True)
    for kind in ("ptr", "tma"):
        top = [kv for kv in best if kv[0].startswith(kind)][:4]
        for key, us in top:
            print(f"   {key:34s} {us:6.1f} us ({gb / us * 1e3:.2f} TB/s)", flush=True)
    results[name] = dict(row, sweep=sweep)
    W = None
    torch.cuda.empty_cache()
    json.dump(results, open(out_path, "w"), indent=1)
