"""Session 27, call A: the 61-row verify's linears in a chain of dependent launches (session 26's harness: 16
distinct matrices per shape, each link a small PDL kernel making the next input + the linear; us per linear),
cuBLASLt against (1) the pointer-loaded skinny kernel with wider output tiles (128-256 outputs per program, 64-wide
K chunks, 8 warps: fewer re-reads of the 61 rows per weight byte) and (2) a TMA variant (weights and rows through
host tensor descriptors, loads pipelined on mbarriers; optionally warp-specialised), both with PDL.

    python docs/results/fast_s27/scripts/tile_sweep.py --out $OUT/tiles.json --deadline 240
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "results", "fast_s26", "scripts"))

from chain_sweep import SHAPES, ew, graph_us  # noqa: E402

from specdec.kernels._triton import pdl_launch, pdl_start  # noqa: E402
from specdec.kernels.skinny import _linear_skinny_triton, _skinny_reduce_kernel  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None


@triton.jit
def _tma_kernel(x_desc, w_desc, y_ptr, M, N, K_PER_SPLIT, stride_ym, stride_ys, SPLIT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                WS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    k0 = pid_k * K_PER_SPLIT
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if WS:
        for kk in tl.range(0, K_PER_SPLIT, BLOCK_K, num_stages=STAGES, warp_specialize=True):
            w = w_desc.load([n0, k0 + kk])
            x = x_desc.load([0, k0 + kk])
            acc = tl.dot(w, x.T, acc)
    else:
        for kk in tl.range(0, K_PER_SPLIT, BLOCK_K, num_stages=STAGES):
            w = w_desc.load([n0, k0 + kk])
            x = x_desc.load([0, k0 + kk])
            acc = tl.dot(w, x.T, acc)
    n = n0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    mask = (n < N)[:, None] & (m < M)[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + m[None, :] * stride_ym + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptr + pid_k * stride_ys + m[None, :] * stride_ym + n[:, None], acc, mask=mask)


@triton.jit
def _tma_pre_kernel(x_desc, w_desc, y_ptr, M, N, K_PER_SPLIT, stride_ym, stride_ys, SPLIT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                    PRE: tl.constexpr, PDL: tl.constexpr = False):
    """The TMA product with its first ``PRE`` (1 or 2) weight tiles loaded before the PDL wait: the weights never
    depend on an earlier kernel, so their first loads overlap the predecessor's tail."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    k0 = pid_k * K_PER_SPLIT
    w0 = w_desc.load([n0, k0])
    if PRE >= 2:
        w1 = w_desc.load([n0, k0 + BLOCK_K])
    pdl_start(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc = tl.dot(w0, x_desc.load([0, k0]).T, acc)
    if PRE >= 2:
        acc = tl.dot(w1, x_desc.load([0, k0 + BLOCK_K]).T, acc)
    for kk in tl.range(PRE * BLOCK_K, K_PER_SPLIT, BLOCK_K, num_stages=STAGES):
        w = w_desc.load([n0, k0 + kk])
        x = x_desc.load([0, k0 + kk])
        acc = tl.dot(w, x.T, acc)
    n = n0 + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    mask = (n < N)[:, None] & (m < M)[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + m[None, :] * stride_ym + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptr + pid_k * stride_ys + m[None, :] * stride_ym + n[:, None], acc, mask=mask)


def make_tma(cfg):
    block_n, block_k, split, warps, stages, ws = cfg[:6]
    pre = cfg[6] if len(cfg) > 6 else 0
    cache = {}

    def lin(x, w):
        rows, k = x.shape
        n = w.shape[0]
        key = (x.data_ptr(), w.data_ptr())
        if key not in cache:
            cache[key] = (TensorDescriptor.from_tensor(x, [64, block_k]),
                          TensorDescriptor.from_tensor(w, [block_n, block_k]))
        xd, wd = cache[key]
        y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
        target = y if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(n, block_n), split)
        common = dict(SPLIT=split, BLOCK_M=64, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, num_warps=warps,
                      **pdl_launch())
        if pre:
            _tma_pre_kernel[grid](xd, wd, target, rows, n, k // split, n, rows * n, PRE=pre, **common)
        else:
            _tma_kernel[grid](xd, wd, target, rows, n, k // split, n, rows * n, WS=ws, **common)
        if split > 1:
            _skinny_reduce_kernel[(triton.cdiv(rows * n, 1024),)](target, w, y, rows * n, n, rows * n, HAS_BIAS=False,
                                                                  SPLIT=split, BLOCK=1024, num_warps=4, **pdl_launch())
        return y
    return lin


def chain(ws, lin, rows=61):
    n, k = ws[0].shape
    x0 = torch.randn(rows, max(n, k), device="cuda", dtype=torch.bfloat16)

    def run():
        x = x0
        for w in ws:
            x = lin(ew(x, k, 0), w)
        return x
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=240.0)
    ap.add_argument("--shapes", nargs="+", default=["qkv", "gate_up", "down", "o"])
    ap.add_argument("--pre", action="store_true", help="call C: weight tiles loaded before the PDL wait")
    ap.add_argument("--ws-only", action="store_true", help="call B: only warp-specialised TMA configurations")
    args = ap.parse_args()
    t0 = time.time()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    print("pdl", bool(pdl_launch()), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    torch.manual_seed(0)
    wide = [(bn, bk, s, 8, st) for bn in (128, 256) for bk in (64,) for s in (1, 2, 4) for st in (4, 6)]
    tma = [(bn, bk, s, w, st, False) for bn, w in ((64, 4), (128, 4), (128, 8), (256, 8))
           for bk in (64, 128) for s in (1, 2, 4) for st in (3, 5)]
    tma += [(128, 64, 1, 8, 4, True), (64, 128, 1, 4, 4, True)]
    if args.pre:  # call C: the best TMA launches of call A with 0, 1, 2 weight tiles before the wait
        wide = []
        tma = [c + (p,) for c in ((64, 128, 1, 4, 3, False), (64, 64, 1, 4, 5, False), (128, 64, 1, 8, 4, False),
                                 (64, 128, 2, 4, 5, False), (64, 64, 4, 4, 5, False), (128, 64, 1, 4, 5, False))
               for p in (0, 1, 2)]
    elif args.ws_only:
        wide = []
        tma = [(bn, bk, s, w, st, True) for bn in (64, 128, 256) for bk in (64, 128) for s in (1, 2) for w in (4, 8)
               for st in (2, 3, 4)]
    res = {}
    for i, name in enumerate(args.shapes):
        n, k = SHAPES[name]
        stop = t0 + args.deadline * (i + 1) / len(args.shapes)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(16)]
        row = {"cublaslt": graph_us(chain(ws, lambda x, w: F.linear(x, w)), len(ws)),
               "skinny default": graph_us(chain(ws, lambda x, w: _linear_skinny_triton(x, w, None)), len(ws))}
        # correctness of the TMA kernel once per shape
        for kind, cfgs in (("tma", tma), ("wide", wide)):
            for cfg in cfgs:
                if time.time() > stop:
                    break
                if k % (cfg[2] * cfg[1]) or (kind == "tma" and TensorDescriptor is None):
                    continue
                lin = ((lambda x, w, c=cfg: _linear_skinny_triton(x, w, None, c)) if kind == "wide"
                       else make_tma(cfg))
                try:
                    x = torch.randn(61, k, device="cuda", dtype=torch.bfloat16)
                    err = (lin(x, ws[0]).float() - F.linear(x, ws[0]).float()).abs().max().item()
                    if err > 0.01 * F.linear(x, ws[0]).float().abs().max().item():
                        print(name, kind, cfg, "WRONG", err, flush=True)
                        continue
                    row[f"{kind} {cfg}"] = graph_us(chain(ws, lin), len(ws))
                except Exception as e:  # noqa: BLE001 - shared memory, registers, unsupported options
                    print(name, kind, cfg, "failed", type(e).__name__, str(e)[:100].replace("\n", " "), flush=True)
        res[name] = row
        tri = {kk: v for kk, v in row.items() if kk not in ("cublaslt", "skinny default")}
        top = sorted(tri, key=tri.get)[:4]
        print(f"{name:8s} cuBLASLt {row['cublaslt']:5.1f} default {row['skinny default']:5.1f} | "
              + "  ".join(f"{kk} {tri[kk]:.1f}" for kk in top) + f" [{time.time() - t0:.0f}s]", flush=True)
        del ws
        torch.cuda.empty_cache()
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
