"""Session 23: a draft head's linear on the H200's float8 tensor cores, both operands float8.

Session 20 stored the head's weights as float8 but multiplied in bf16 (each weight tile converted in registers) and
streamed only 1.6-2.5 TB/s. Here the rows are rounded to float8 as well (one scale per row, one per output feature),
so the tensor cores take the weight tiles as they come from memory. Variants timed per head shape (CUDA-graph
replays, the weights cycled through 4 copies so none is read from L2):

- ``bf16``: specdec.kernels.linear_skinny (the library's, session 22);
- ``scaled_mm``: torch._scaled_mm (cuBLASLt float8, row-wise scales), the rows already float8 (+ the rounding
  of the rows timed alone as ``quant``);
- ``f8pre``: the Triton kernel below on rows already float8;
- ``f8``: the Triton kernel rounding the bf16 rows itself (a first pass over the rows for their largest entries,
  from L2), so a projection is one launch;
- ``f8blk``: the same with one scale per row and ``BLOCK_K`` chunk (taken from the chunk in registers, no first
  pass; each chunk's product scaled before it is added).

    python docs/results/fast_s23/scripts/fp8_native.py --out $OUT/fp8.json
"""
# ruff: noqa: B023, B007, E501  (a record: the closures run inside their loop iteration)
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

from specdec.kernels._triton import jit, next_pow2, tl  # noqa: E402
from specdec.kernels.skinny import _linear_skinny_triton  # noqa: E402

F8 = torch.float8_e4m3fn
F8_MAX = 448.0
SHAPES = {"fc": (4096, 8192, True), "qkv": (12288, 4096, False), "o": (4096, 4096, False),
          "gate_up": (22016, 4096, False), "down": (4096, 11008, False), "lm_fr": (8192, 4096, False)}


def quant_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``t [R, K]`` -> (float8 ``[R, K]``, float32 scale ``[R]``), one scale per row."""
    amax = t.float().abs().amax(dim=1).clamp_min(1e-12)
    scale = amax / F8_MAX
    return (t.float() / scale[:, None]).clamp(-F8_MAX, F8_MAX).to(F8), scale


@jit
def _f8_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, M, N, K, K_PER, stride_xm, stride_wn, stride_ym,
               stride_ys, HAS_BIAS: tl.constexpr, QUANT_X: tl.constexpr, BLOCKWISE: tl.constexpr, SPLIT: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    kk = tl.arange(0, BLOCK_K)
    n_in, m_in = n < N, m < M
    if BLOCKWISE:
        xs = tl.full((BLOCK_M,), 1.0, tl.float32)
    elif QUANT_X:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            xa = tl.load(x_ptr + m[None, :] * stride_xm + (start + kk)[:, None], mask=m_in[None, :], other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(xa.to(tl.float32)), axis=0))
        xs = tl.maximum(amax, 1e-12) / 448.0
        inv = 1.0 / xs
    else:
        xs = tl.load(xs_ptr + m, mask=m_in, other=0.0)
    k0 = pid_k * K_PER
    w_ptrs = w_ptr + n[:, None].to(tl.int64) * stride_wn + (k0 + kk)[None, :]
    x_ptrs = x_ptr + m[None, :] * stride_xm + (k0 + kk)[:, None]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for start in range(0, K_PER, BLOCK_K):
        w = tl.load(w_ptrs, mask=n_in[:, None], other=0.0)
        x = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
        if BLOCKWISE:
            xf = x.to(tl.float32)
            sb = tl.maximum(tl.max(tl.abs(xf), axis=0), 1e-12) / 448.0
            xq = (xf * (1.0 / sb)[None, :]).to(tl.float8e4nv)
            acc += tl.dot(w, xq) * sb[None, :]
        elif QUANT_X:
            x = tl.clamp(x.to(tl.float32) * inv[None, :], -448.0, 448.0).to(tl.float8e4nv)
            acc = tl.dot(w, x, acc)
        else:
            acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    acc = acc * tl.load(ws_ptr + n, mask=n_in, other=0.0)[:, None] * xs[None, :]
    out_mask = n_in[:, None] & m_in[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_in, other=0.0).to(tl.float32)[:, None]
        tl.store(y_ptr + m[None, :] * stride_ym + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(y_ptr + pid_k * stride_ys + m[None, :] * stride_ym + n[:, None], acc, mask=out_mask)


@jit
def _sum_kernel(p_ptr, b_ptr, y_ptr, MN, N, stride_ps, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(p_ptr + s * stride_ps + i, mask=inside, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + i % N, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, acc.to(y_ptr.dtype.element_ty), mask=inside)


def linear_f8(x, xs, w8, ws, bias, config, out_dtype=torch.bfloat16, blockwise=False):
    """x: bf16 [M, K] (xs None: rounded in the kernel) or float8 [M, K] with scales xs [M]."""
    block_n, block_k, split, warps, stages = config
    rows, k = x.shape
    n = w8.shape[0]
    y = torch.empty(rows, n, dtype=out_dtype, device=x.device)
    k_per = k // split
    target = y if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=x.device)
    b = bias if bias is not None else ws
    _f8_kernel[(-(-n // block_n), split)](
        x, xs if xs is not None else ws, w8, ws, b, target, rows, n, k, k_per, x.stride(0), w8.stride(0), n,
        rows * n if split > 1 else 0, HAS_BIAS=bias is not None, QUANT_X=xs is None, BLOCKWISE=blockwise, SPLIT=split,
        BLOCK_M=max(16, next_pow2(rows)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    if split > 1:
        _sum_kernel[(-(-(rows * n) // 1024),)](target, b, y, rows * n, n, rows * n, HAS_BIAS=bias is not None,
                                              SPLIT=split, BLOCK=1024, num_warps=4)
    return y


def configs():
    for bn, bk, split, stages, warps in itertools.product((64, 128), (128, 256), (1, 2), (3, 5), (4, 8)):
        if warps == 8 and bn == 64:
            continue
        yield (bn, bk, split, warps, stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 7])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=200.0)
    args = ap.parse_args()
    start = time.time()
    results = []
    for rows in args.rows:
        for name, (n, k, has_bias) in SHAPES.items():
            if time.time() - start > args.deadline:
                print("deadline reached", flush=True)
                break
            ws_bf = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(args.copies)]
            qs = [quant_rows(w) for w in ws_bf]
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if has_bias else None
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            x8, xs = quant_rows(x)
            ref = F.linear(x.float(), ws_bf[0].float(), None if b is None else b.float())
            ref8 = (x8.float() * xs[:, None]) @ (qs[0][0].float() * qs[0][1][:, None]).t() + (0 if b is None else b.float())

            def timed(make, n_calls=20, reps=20):
                calls = itertools.cycle([make(i) for i in range(args.copies)])
                return 1e3 * graph_ms(lambda: next(calls)(), n=n_calls, reps=reps)

            row = dict(rows=rows, shape=name, n=n, k=k)
            row["bf16_us"] = timed(lambda i: functools.partial(_linear_skinny_triton, x, ws_bf[i], b))
            row["quant_us"] = timed(lambda i: functools.partial(quant_rows, x))
            xp = torch.zeros(16, k, device="cuda", dtype=F8)
            xp[:rows] = x8
            xsp = torch.ones(16, 1, device="cuda")
            xsp[:rows, 0] = xs
            try:
                def sm(i):
                    return functools.partial(torch._scaled_mm, xp, qs[i][0].t(), scale_a=xsp,
                                             scale_b=qs[i][1][None, :].contiguous(), bias=b, out_dtype=torch.bfloat16)
                got = sm(0)()[:rows].float()
                row["scaled_mm_err"] = (got - ref8).abs().max().item()
                row["scaled_mm_us"] = timed(sm)
            except Exception as exc:  # noqa: BLE001
                row["scaled_mm_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            best = {}
            for mode in ("f8pre", "f8", "f8blk"):
                for cfg in configs():
                    if k % (cfg[1] * cfg[2]):
                        continue
                    try:
                        def mk(i, mode=mode, cfg=cfg):
                            return functools.partial(linear_f8, x8 if mode == "f8pre" else x,
                                                     xs if mode == "f8pre" else None, qs[i][0], qs[i][1], b, cfg,
                                                     blockwise=mode == "f8blk")
                        err = (mk(0)().float() - ref8).abs().max().item()
                        us = timed(mk, n_calls=10, reps=10)
                    except Exception as exc:  # noqa: BLE001
                        row.setdefault("errors", []).append(f"{mode} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    if mode not in best or us < best[mode][0]:
                        best[mode] = (us, cfg, err)
            for mode, (us, cfg, err) in best.items():
                row[f"{mode}_us"], row[f"{mode}_cfg"], row[f"{mode}_err"] = us, list(cfg), err
            row["err_f8_vs_bf16_ref"] = (ref8 - ref).abs().max().item() / ref.abs().max().item()
            gb16 = n * k * 2 / 1e9
            print(f"rows={rows} {name:7s}: bf16 {row['bf16_us']:6.1f} ({gb16 / row['bf16_us'] * 1e3:.2f} TB/s)  "
                  f"quant {row['quant_us']:5.1f}  scaled_mm {row.get('scaled_mm_us', float('nan')):6.1f}  "
                  + "  ".join(f"{md} {best[md][0]:6.1f} ({gb16 / 2 / best[md][0] * 1e3:.2f}) {best[md][1]}"
                              for md in best)
                  + f"  rel.err f8 {row['err_f8_vs_bf16_ref']:.3f} [{time.time() - start:.0f}s]", flush=True)
            if "errors" in row:
                print("   first error:", row["errors"][0], f"({len(row['errors'])} configs failed)")
            results.append(row)
            with open(args.out, "w") as f:
                json.dump(results, f)
    for rows in args.rows:
        rs = [r for r in results if r["rows"] == rows]
        if rs:
            print(f"rows={rows}: sum over {len(rs)} shapes: bf16 {sum(r['bf16_us'] for r in rs):.1f} us, "
                  + "  ".join(f"{md} {sum(r.get(md + '_us', float('nan')) for r in rs):.1f}"
                              for md in ("scaled_mm", "f8pre", "f8", "f8blk")))


if __name__ == "__main__":
    main()
