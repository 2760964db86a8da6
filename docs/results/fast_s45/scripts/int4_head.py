"""Session 45: can a 4-bit draft head halve the float8 head's product time? A prototype product for the 7B EAGLE
head's six matrices at 10 rows (an EAGLE-2 level) and 7 (an update), against the library's float8 product.

The weights: 4-bit codes ``c`` in 0..15 with one float32 scale per 128 inputs of a row, ``w = (c - 8) * s`` (round to
nearest, ``s = amax / 7`` per group). Two codes per byte: in each 256-input chunk of a row, byte ``j`` holds input
``j`` in its low half and input ``128 + j`` in its high half, so a program splits a loaded ``[BLOCK_N, 128]`` byte
tile into two ``[BLOCK_N, 128]`` code tiles with one mask and one shift and no interleaving. A code ``c`` in a byte
read as e4m3 is exactly ``c * 2^-9`` (the codes 0-7 are e4m3's subnormals, 8-15 its first binade), so the tiles go
into the float8 tensor cores as they are, against the rows rounded to float8 as the library's float8 head rounds
them; per group, ``sum_k (c - 8) x_k = 512 * dot - 8 * sum_k x_k``, the scale stored times 512.

    python docs/results/fast_s45/scripts/int4_head.py OUT.json [--deadline 200]

On the CPU (``TRITON_INTERPRET=1``) it checks the kernel against the torch reference on small shapes and exits.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import time

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import pdl_launch, pdl_start
from specdec.kernels.fp8 import FP8_DTYPE, _fp8_product, quantize_fp8_rows
from specdec.kernels.skinny import _skinny_reduce_kernel

GROUP = 128  # inputs per scale; a 256-input chunk is two groups, its low and high halves


def pack_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` (K a multiple of 256) -> codes ``[N, K / 2]`` uint8 (the chunk layout above) and the scales
    ``[N, K / 128]`` float32 times 512 (what the kernel multiplies by)."""
    n, k = w.shape
    g = w.float().view(n, k // GROUP, GROUP)
    s = (g.abs().amax(-1) / 7).clamp_min(1e-12)
    c = (torch.round(g / s[..., None]).clamp(-8, 7) + 8).to(torch.uint8).view(n, k // 256, 2, 128)
    packed = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    return packed, (s * 512).contiguous()


def unpack_int4(packed: torch.Tensor, s512: torch.Tensor) -> torch.Tensor:
    """The float32 weights ``[N, K]`` that :func:`pack_int4`'s output stands for."""
    n = packed.shape[0]
    p = packed.view(n, -1, 128)
    c = torch.stack([p & 15, p >> 4], dim=2).reshape(n, -1).float() - 8
    return (c.view(n, -1, GROUP) * (s512 / 512)[..., None]).reshape(n, -1)


@triton.jit
def _int4_kernel(q_ptr, xs_ptr, p_ptr, s_ptr, y_ptr, M, N, K, K_PER, stride_pn, stride_sn, stride_ys,
                 SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``(pid_n, pid_k)``: ``y[m, n] = xs[m] * sum_k q[m, k] w[n, k]`` over split ``pid_k`` of ``K``
    (float32 partials when ``SPLIT > 1``)."""
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_in, m_in = n < N, m < M
    jj = tl.arange(0, 128)
    k0 = pid_k * K_PER
    p_ptrs = p_ptr + n[:, None].to(tl.int64) * stride_pn + (k0 // 2 + jj)[None, :]
    x_ptrs = q_ptr + m[None, :].to(tl.int64) * K + (k0 + jj)[:, None]
    s_ptrs = s_ptr + n.to(tl.int64) * stride_sn + k0 // 128
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, K_PER, 256):
        p = tl.load(p_ptrs, mask=n_in[:, None], other=0)
        x_lo = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
        x_hi = tl.load(x_ptrs + 128, mask=m_in[None, :], other=0.0)
        s_lo = tl.load(s_ptrs, mask=n_in, other=0.0)
        s_hi = tl.load(s_ptrs + 1, mask=n_in, other=0.0)
        lo = (p & 15).to(tl.float8e4nv, bitcast=True)
        hi = (p >> 4).to(tl.float8e4nv, bitcast=True)
        d_lo = tl.dot(lo, x_lo)
        d_hi = tl.dot(hi, x_hi)
        sum_lo = tl.sum(x_lo.to(tl.float32), axis=0) * (1.0 / 64.0)
        sum_hi = tl.sum(x_hi.to(tl.float32), axis=0) * (1.0 / 64.0)
        acc += s_lo[:, None] * (d_lo - sum_lo[None, :]) + s_hi[:, None] * (d_hi - sum_hi[None, :])
        p_ptrs += 128
        x_ptrs += 256
        s_ptrs += 2
    acc = acc * tl.load(xs_ptr + m, mask=m_in, other=0.0)[None, :]
    out = n_in[:, None] & m_in[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + m[None, :] * N + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=out)
    else:
        tl.store(y_ptr + pid_k * stride_ys + m[None, :] * N + n[:, None], acc, mask=out)


def int4_product(q, xs, packed, s512, dtype, cfg=(64, 1, 4, 3)) -> torch.Tensor:
    """``[rows, N]``: the float8 rows ``q [rows, K]`` (scales ``xs``) times the 4-bit weights."""
    block_n, split, warps, stages = cfg
    rows, k = q.shape
    n = packed.shape[0]
    y = torch.empty(rows, n, dtype=dtype, device=q.device)
    k_per = k // split
    assert k_per % 256 == 0, (k, split)
    target = y if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=q.device)
    _int4_kernel[(triton.cdiv(n, block_n), split)](
        q, xs, packed, s512, target, rows, n, k, k_per, packed.stride(0), s512.stride(0), rows * n,
        SPLIT=split, BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n, num_warps=warps,
        num_stages=stages, **pdl_launch())
    if split > 1:
        _skinny_reduce_kernel[(triton.cdiv(rows * n, 1024),)](target, s512, y, rows * n, n, rows * n, HAS_BIAS=False,
                                                              SPLIT=split, BLOCK=1024, num_warps=4, **pdl_launch())
    return y


def check(dev: str, shapes) -> float:
    """Largest error of the kernel against the float64 product of the same rounded operands, relative to the
    output's largest magnitude."""
    worst = 0.0
    gen = torch.Generator(device=dev).manual_seed(0)
    for (n, k), rows, cfg in shapes:
        w = torch.randn(n, k, device=dev, generator=gen) * 0.02
        packed, s512 = pack_int4(w)
        x = torch.randn(rows, k, device=dev, generator=gen).to(torch.bfloat16)
        q, xs = quantize_fp8_rows(x)
        y = int4_product(q, xs, packed, s512, torch.float32, cfg)
        ref = (q.double() * xs.double()[:, None]) @ unpack_int4(packed, s512).double().T
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        rel_w = ((unpack_int4(packed, s512) - w).norm() / w.norm()).item()
        print(f"check {n}x{k} rows {rows} cfg {cfg}: max err / max |y| {err:.2e} (weights' rounding "
              f"{rel_w:.3f} of their norm)", flush=True)
        worst = max(worst, err)
    return worst


def _chain_tools():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "fast_s26", "scripts", "chain_sweep.py")
    spec = importlib.util.spec_from_file_location("chain_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--deadline", type=float, default=200.0)
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 7])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        worst = check("cpu", [((256, 512), 10, (64, 1, 4, 3)), ((320, 1024), 7, (64, 2, 4, 3)),
                              ((96, 256), 3, (32, 1, 4, 2))])
        print("worst", worst)
        assert worst < 1e-5, worst
        return
    chain = _chain_tools()
    t0 = time.time()
    worst = check("cuda", [((4096, 4096), 10, (64, 1, 4, 3)), ((8192, 4096), 7, (64, 2, 4, 3)),
                           ((4096, 11008), 10, (128, 1, 8, 3))])
    res = {"check_worst": worst}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in chain.HEAD.items():
        ws8 = [(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen).to(FP8_DTYPE),
                torch.rand(n, device="cuda") + 0.5) for _ in range(16)]
        ws4 = [pack_int4(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen)) for _ in range(16)]
        for rows in args.rows:
            x0 = torch.randn(rows, max(n, k), device="cuda", dtype=torch.bfloat16, generator=gen)

            def run(product):
                def fn():
                    x = x0
                    for i in range(16):
                        a = chain.ew(x, k, 0)
                        q, s = quantize_fp8_rows(a)
                        x = product(q, s, i) if product else a
                    return x
                return fn
            row = {"base": chain.graph_us(run(None), 16),
                   "fp8": chain.graph_us(run(lambda q, s, i: _fp8_product(q, s, *ws8[i], None, torch.bfloat16, rows,
                                                                          n, k)), 16)}
            for bn, split, stages in itertools.product((32, 64, 128), (1, 2, 4), (2, 3, 4, 5)):
                if time.time() - t0 > args.deadline or (k // split) % 256:
                    continue
                cfg = (bn, split, 8 if bn == 128 else 4, stages)
                try:
                    row[str(cfg)] = chain.graph_us(run(lambda q, s, i, c=cfg: int4_product(q, s, *ws4[i],
                                                                                           torch.bfloat16, c)), 16)
                except Exception as err:  # noqa: BLE001 - a configuration the compiler refuses
                    print(name, cfg, "failed", str(err)[:100], flush=True)
            sweep = {key: v for key, v in row.items() if key.startswith("(")}
            best = min(sweep, key=sweep.get) if sweep else None
            res[f"{name} {rows}"] = dict(row, best=best)
            net = lambda v: v - row["base"]  # noqa: E731
            print(f"{name:8s} rows {rows:2d}: base {row['base']:5.1f}  fp8 {net(row['fp8']):5.1f} us "
                  f"({n * k / net(row['fp8']) / 1e6:4.2f} TB/s)  int4 best {best} {net(sweep.get(best, 1e9)):5.1f} us "
                  f"({n * k / 2 / net(sweep.get(best, 1e9)) / 1e6:4.2f} TB/s)  [{time.time() - t0:.0f}s]", flush=True)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
