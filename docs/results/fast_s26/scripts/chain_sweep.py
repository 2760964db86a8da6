"""Session 26: the 7B verify forward's linears as a chain of dependent launches, cuBLASLt against the tensor-core
skinny kernel with programmatic dependent launch and an L2 prefetch of its weights before the wait.

Each "shape chain" is a CUDA graph of 32 x [a small PDL Triton kernel making the next input, one linear] over 32
distinct weight matrices of the shape (L2-cold, as in a forward), timed per linear. Then one whole layer stack (32
layers of qkv / o / gate-up / down with the element-wise kernels between, and the 32,000-row lm_head): cuBLASLt
against the skinny kernel with the best settings found. Rows: 61 (the verify at batch 1), 1 (the plain step's GEMV,
for reference) and 10 (the float8 draft head's level products).

    python docs/results/fast_s26/scripts/chain_sweep.py --out $OUT/chain.json --deadline 300

Ran (call A) against a library version with a ``prefetch`` argument on ``linear_rows`` / ``linear_skinny`` /
``linear_fp8`` (bytes of each weight row brought into L2 by ``cp.async.bulk.prefetch.L2`` before the programmatic-
dependent-launch wait; ``SPECDEC_L2_PREFETCH`` for the 7B runs). It was slower at every size and was reverted, so
this script's ``prefetch`` values need that version to run again.
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

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
sys.path.insert(0, ROOT)

from specdec.kernels._triton import pdl_launch, pdl_start  # noqa: E402
from specdec.kernels.fp8 import _fp8_product, quantize_fp8_rows  # noqa: E402
from specdec.kernels.gemv import _linear_rows_triton  # noqa: E402
from specdec.kernels.skinny import _linear_skinny_triton, skinny_config  # noqa: E402

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
          "lm": (32000, 4096)}
HEAD = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
        "fc": (4096, 8192), "lm_fr": (8192, 4096)}


@triton.jit
def _ew(x_ptr, y_ptr, M, N, NSRC, sx, sy, MODE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """y[m, j] for j < N: MODE 0 x[m, j % NSRC] * 0.5, MODE 1 silu(x[m, j]) * x[m, j + N]."""
    pdl_start(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m, j = i // N, i % N
    inside = i < M * N
    x = tl.load(x_ptr + m * sx + (j % NSRC if MODE == 0 else j), mask=inside, other=0.0).to(tl.float32)
    if MODE == 0:
        y = x * 0.5
    else:
        u = tl.load(x_ptr + m * sx + j + N, mask=inside, other=0.0).to(tl.float32)
        y = x / (1.0 + tl.exp(-x)) * u
    tl.store(y_ptr + m * sy + j, y.to(y_ptr.dtype.element_ty), mask=inside)


def ew(x, n, mode):
    rows = x.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    _ew[(triton.cdiv(rows * n, 1024),)](x, y, rows, n, x.shape[1], x.stride(0), y.stride(0), MODE=mode, BLOCK=1024,
                                        num_warps=4,
                                        **pdl_launch())
    return y


def graph_us(fn, per: int, reps: int = 10, trials: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e18
    for _ in range(trials):
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps / per)
    del g
    return best


def linear_fn(kind, cfg=None, prefetch=0):
    if kind == "cublaslt":
        return lambda x, w: F.linear(x, w)
    if kind == "gemv":
        return lambda x, w: _linear_rows_triton(x, w, None, None, prefetch)
    return lambda x, w: _linear_skinny_triton(x, w, None, cfg, prefetch)


def shape_chain(ws, rows, lin):
    n, k = ws[0].shape
    x0 = torch.randn(rows, max(n, k), device="cuda", dtype=torch.bfloat16)

    def run():
        x = x0
        for w in ws:
            x = ew(x, k, 0)  # the next input: [rows, k]
            x = lin(x, w)
        return x
    return run


def configs():
    for bn in (32, 64, 128):
        for split in (1, 2, 4):
            for stages in (3, 4):
                yield (bn, 128, split, 8 if bn == 128 else 4, stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--deadline", type=float, default=300.0)
    ap.add_argument("--prefetch", type=int, nargs="+", default=[0, 1024, 4096])
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    t0 = time.time()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    print("pdl", bool(pdl_launch()), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    res = {"shape": {}, "gemv": {}, "fp8": {}, "stack": {}}
    best_cfg = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in SHAPES.items():
        ws = [torch.empty(n, k, device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
              for _ in range(args.layers if name != "lm" else 8)]
        row = {}
        row["cublaslt"] = graph_us(shape_chain(ws, 61, linear_fn("cublaslt")), len(ws))
        row["skinny default P0"] = graph_us(shape_chain(ws, 61, linear_fn("skinny", skinny_config(61, n, k), 0)),
                                            len(ws))
        for cfg in configs():
            if time.time() - t0 > args.deadline:
                break
            if k % (cfg[2] * cfg[1]):
                continue
            for p in args.prefetch:
                try:
                    row[f"skinny {cfg} P{p}"] = graph_us(shape_chain(ws, 61, linear_fn("skinny", cfg, p)), len(ws))
                except Exception as err:  # noqa: BLE001 - a config the compiler refuses (shared memory)
                    row[f"skinny {cfg} P{p}"] = None
                    print(name, cfg, p, "failed:", str(err)[:120], flush=True)
        sk = {key: v for key, v in row.items() if key.startswith("skinny (") and v}
        bkey = min(sk, key=sk.get) if sk else None
        best_cfg[name] = bkey
        gv = {}
        for p in args.prefetch:
            gv[f"P{p}"] = graph_us(shape_chain(ws, 1, linear_fn("gemv", None, p)), len(ws))
        gv["cublaslt"] = graph_us(shape_chain(ws, 1, linear_fn("cublaslt")), len(ws))
        res["shape"][name] = row
        res["gemv"][name] = gv
        bytes_ = n * k * 2
        print(f"{name:8s} 61 rows: cuBLASLt {row['cublaslt']:6.1f} us ({bytes_ / row['cublaslt'] / 1e6:4.2f} TB/s)  "
              f"skinny default {row['skinny default P0']:6.1f}  best {bkey} {sk.get(bkey, float('nan')):6.1f} "
              f"({bytes_ / sk.get(bkey, 1e18) / 1e6:4.2f} TB/s) | 1 row GEMV "
              + " ".join(f"{kk} {vv:5.1f}" for kk, vv in gv.items()) + f"  [{time.time() - t0:.0f}s]", flush=True)
        del ws
        torch.cuda.empty_cache()
    # the float8 head's products at 10 rows
    for name, (n, k) in HEAD.items():
        w8s = [(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen).to(torch.float8_e4m3fn),
                torch.rand(n, device="cuda") + 0.5) for _ in range(16)]
        x0 = torch.randn(10, max(n, k), device="cuda", dtype=torch.bfloat16)
        row = {}
        for p in args.prefetch:
            import specdec.kernels._triton as tri
            tri.set_l2_prefetch(p)

            def run():
                x = x0
                for w8, sc in w8s:
                    q, s = quantize_fp8_rows(ew(x, k, 0))
                    x = _fp8_product(q, s, w8, sc, None, torch.bfloat16, 10, n, k)
                return x
            row[f"P{p}"] = graph_us(run, len(w8s))
            tri.set_l2_prefetch(None)
        res["fp8"][name] = row
        print(f"fp8 head {name:6s} 10 rows (quantize + product): "
              + " ".join(f"{kk} {vv:5.1f}" for kk, vv in row.items()), flush=True)
        w8s = None  # noqa: F841 - free the weights before the next shape
    # the whole stack: 32 layers + lm_head, 61 rows
    L = args.layers
    gen = torch.Generator(device="cuda").manual_seed(1)
    layers = [{name: torch.empty(*SHAPES[name], device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
               for name in ("qkv", "o", "gate_up", "down")} for _ in range(L)]
    lm = torch.empty(*SHAPES["lm"], device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
    x0 = torch.randn(61, 4096, device="cuda", dtype=torch.bfloat16)

    def stack(lins):
        def run():
            h = x0
            for lw in layers:
                a = ew(h, 4096, 0)
                qkv = lins["qkv"](a, lw["qkv"])
                o = lins["o"](ew(qkv, 4096, 0), lw["o"])
                gu = lins["gate_up"](ew(o, 4096, 0), lw["gate_up"])
                h = lins["down"](ew(gu, 11008, 1), lw["down"])
            return lins["lm"](ew(h, 4096, 0), lm)
        return run

    def parse(key):
        cfg = tuple(int(v) for v in key[key.index("(") + 1:key.index(")")].split(","))
        return cfg, int(key.rsplit("P", 1)[1])
    variants = {"cublaslt": {nm: linear_fn("cublaslt") for nm in SHAPES}}
    for p in args.prefetch:
        variants[f"skinny default P{p}"] = {nm: linear_fn("skinny", skinny_config(61, *SHAPES[nm]), p) for nm in SHAPES}
    if all(best_cfg.values()):
        variants["skinny best"] = {nm: linear_fn("skinny", *parse(best_cfg[nm])) for nm in SHAPES}
        variants["mixed best"] = {nm: (linear_fn("skinny", *parse(best_cfg[nm]))
                                       if res["shape"][nm][best_cfg[nm]] < res["shape"][nm]["cublaslt"]
                                       else linear_fn("cublaslt")) for nm in SHAPES}
    for vname, lins in variants.items():
        res["stack"][vname] = graph_us(stack(lins), 1, reps=5) / 1e3
        print(f"stack {vname:24s} {res['stack'][vname]:.3f} ms", flush=True)
    res["best_cfg"] = best_cfg
    json.dump(res, open(args.out, "w"), indent=1)
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
