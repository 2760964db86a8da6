"""Session 22: the tensor-core skinny linear (specdec.kernels.linear_skinny) against cuBLASLt / cuBLAS.

Shapes: the Llama-2-7B target's fused matrices and its EAGLE head's (fc with bias, FR-Spec lm_head of 8192 rows),
at the row counts of one EAGLE-2 step at batch 1 (update 7, tree levels 10, verify 61) and 16. CUDA-graph replays.
Prints one line per (rows, shape) and writes the whole sweep as JSON.

    python docs/results/fast_s22/scripts/sweep_skinny.py --out $OUT/sweep.json --deadline 480
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from bench_gemv import graph_ms  # noqa: E402

from specdec.kernels.gemv import _linear_rows_triton  # noqa: E402
from specdec.kernels.skinny import _linear_skinny_triton, skinny_config  # noqa: E402

SHAPES = {"qkv": (12288, 4096, False), "o": (4096, 4096, False), "gate_up": (22016, 4096, False),
          "down": (4096, 11008, False), "fc": (4096, 8192, True), "lm_fr": (8192, 4096, False),
          "lm": (32000, 4096, False)}


def configs(wide: bool = False):
    grid = (((64, 128, 256), (64, 128), (1, 2), (3, 4)) if wide else ((32, 64, 128), (64, 128, 256), (1, 2, 4), (3, 5)))
    for bn, bk, split, stages in itertools.product(*grid):
        for warps in ((4,) if bn < 128 else (4, 8)):
            if bn * bk * 2 * stages > 200_000:
                continue
            yield (bn, bk, split, warps, stages)


def blas_ms(timed, lib: str) -> float:
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(lib)
    try:
        return timed(F.linear)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[61, 10, 7])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--deadline", type=float, default=480.0)
    ap.add_argument("--wide", action="store_true", help="the wider-tile grid (for verify-sized row counts)")
    ap.add_argument("--copies", type=int, default=1,
                    help="cycle through this many copies of each weight (working set past the L2 cache)")
    args = ap.parse_args()
    start = time.time()
    dtype = torch.bfloat16
    results = []
    for rows in args.rows:
        for name in args.shapes:
            if time.time() - start > args.deadline:
                print("deadline reached", flush=True)
                break
            n, k, has_bias = SHAPES[name]
            ws = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(args.copies)]
            w = ws[0]
            b = torch.randn(n, device="cuda", dtype=dtype) if has_bias else None
            x = torch.randn(rows, k, device="cuda", dtype=dtype)
            ref = F.linear(x.float(), w.float(), None if b is None else b.float())
            gb = (n * k + rows * k + rows * n) * 2 / 1e9
            def timed(fn, *extra, n_calls=20, reps=20, x=x, b=b, ws=ws):
                """ms of one call of fn(x, w_i, b, *extra), the weights taken in turn."""
                calls = itertools.cycle([functools.partial(fn, x, wi, b, *extra) for wi in ws])
                return graph_ms(lambda: next(calls)(), n=n_calls, reps=reps)

            row = dict(rows=rows, shape=name, n=n, k=k, copies=args.copies,
                       lt_us=1e3 * blas_ms(timed, "cublaslt"), cublas_us=1e3 * blas_ms(timed, "cublas"))
            if rows <= 16:
                row["gemv_us"] = 1e3 * timed(_linear_rows_triton)
            default = skinny_config(rows, n, k)
            row["default_config"] = list(default)
            row["default_us"] = 1e3 * timed(_linear_skinny_triton, default)
            best, sweep = (row["default_us"], list(default)), []
            for cfg in configs(args.wide):
                try:
                    err = (_linear_skinny_triton(x, w, b, cfg).float() - ref).abs().max().item()
                    us = 1e3 * timed(_linear_skinny_triton, cfg, n_calls=10, reps=10)
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit is skipped
                    sweep.append(dict(config=list(cfg), error=type(exc).__name__))
                    continue
                sweep.append(dict(config=list(cfg), us=us, err=err))
                best = min(best, (us, list(cfg)))
            row.update(best_us=best[0], best_config=best[1], sweep=sweep)
            tb = {key: gb / (row[key] * 1e-6) / 1e3 for key in ("lt_us", "cublas_us", "default_us", "best_us")}
            print(f"rows={rows:2d} {name:7s} {n:5d}x{k:5d}: Lt {row['lt_us']:6.1f} ({tb['lt_us']:.2f} TB/s)  "
                  f"cuBLAS {row['cublas_us']:6.1f} ({tb['cublas_us']:.2f})  "
                  + (f"gemv {row['gemv_us']:6.1f}  " if "gemv_us" in row else "")
                  + f"skinny {row['default_us']:6.1f} ({tb['default_us']:.2f}) {tuple(default)}  "
                  f"best {row['best_us']:6.1f} ({tb['best_us']:.2f}) {tuple(best[1])}  [{time.time() - start:.0f}s]",
                  flush=True)
            results.append(row)
            with open(args.out, "w") as f:
                json.dump(results, f)
    print("\n== summary: best skinny vs min(Lt, cuBLAS), us")
    for rows in args.rows:
        rs = [r for r in results if r["rows"] == rows]
        if rs:
            lib = sum(min(r["lt_us"], r["cublas_us"]) for r in rs)
            print(f"rows={rows:2d}: library {lib:7.1f}  skinny default {sum(r['default_us'] for r in rs):7.1f}  "
                  f"skinny best {sum(r['best_us'] for r in rs):7.1f}  over {len(rs)} shapes")


if __name__ == "__main__":
    main()
