"""Session 45: can a 4-bit draft head halve the float8 head's product time? A prototype product for the 7B EAGLE
head's six matrices at 10 rows (an EAGLE-2 level), against the library's float8 product.

The weights: 4-bit codes with one float32 scale per 128 inputs of a row (round to nearest, ``s = amax / 7``). Two
codes per byte: in each 256-input chunk of a row, byte ``j`` holds input ``j`` in its low half and input ``128 + j``
in its high half, so a program splits a loaded ``[BLOCK_N, 128]`` byte tile into two code tiles with one mask (or
one shift and mask) and no interleaving. A code ``c`` in 0..15 read as an e4m3 byte is exactly ``c * 2^-9`` (0-7
are e4m3's subnormals, 8-15 its first binade), so the tiles go into the float8 tensor cores as they are, against
the rows rounded to float8 as the library's float8 head rounds them. The kernel's ``SUMS`` mode handles the sign:
0-2 store ``v + 8`` and correct each group by the rows' sums (``sum_k (c - 8) x_k = 512 * dot - 8 * sum_k x_k``,
the scale stored times 512), summed in the kernel (0), read from a precomputed ``[rows, K / 128]`` (1) or taken on
the tensor cores as a product with a tile of ``2^-6`` (2); 3 stores sign-magnitude codes (the sign moved to the
byte's top bit), no correction. Call A of session 45 ran an earlier version (``SUMS`` 0 / 1 only, and a byte offset
that cost the loads their alignment); calls B and C this one.

    python docs/results/fast_s45/scripts/int4_head.py OUT.json [--rows 10] [--deadline 220]

On the CPU (``TRITON_INTERPRET=1``) it checks every mode against the float64 product of the rounded operands on
small shapes and exits.
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


def pack_int4(w: torch.Tensor, signed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` (K a multiple of 256) -> codes ``[N, K / 2]`` uint8 (the chunk layout above) and the scales
    ``[K / 128, N]`` float32 times 512 (what the kernel multiplies by; a group's scales contiguous). ``signed``:
    a code is a sign bit (its top bit) and a magnitude 0..7, not ``v + 8``."""
    n, k = w.shape
    g = w.float().view(n, k // GROUP, GROUP)
    s = (g.abs().amax(-1) / 7).clamp_min(1e-12)
    v = torch.round(g / s[..., None]).clamp(-7, 7)
    c = (torch.where(v < 0, 8 - v, v) if signed else v + 8).to(torch.uint8).view(n, k // 256, 2, 128)
    packed = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    return packed, (s * 512).T.contiguous()


def unpack_int4(packed: torch.Tensor, s512: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """The float32 weights ``[N, K]`` that :func:`pack_int4`'s output stands for."""
    n = packed.shape[0]
    p = packed.view(n, -1, 128)
    c = torch.stack([p & 15, p >> 4], dim=2).reshape(n, -1).float()
    c = torch.where(c >= 8, 8 - c, c) if signed else c - 8
    return (c.view(n, -1, GROUP) * (s512.T / 512)[..., None]).reshape(n, -1)


@triton.jit
def _chunk_load(p_ptrs, x_ptrs, s_ptrs, g_ptrs, N, n_in, m_in, left, SUMS: tl.constexpr):
    """One 256-input chunk's operands: the code bytes ``[BLOCK_N, 128]``, the two halves of the float8 rows
    ``[128, BLOCK_M]``, the two groups' scales ``[BLOCK_N]`` and (``SUMS``) the rows' group sums ``[BLOCK_M]``."""
    n_in = n_in & (n_in.to(tl.int32) * 0 + left > 0)  # ``left``: chunks from this one on; none: nothing loaded
    m_in = m_in & (m_in.to(tl.int32) * 0 + left > 0)
    p = tl.load(p_ptrs, mask=n_in[:, None], other=0)
    x_lo = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
    x_hi = tl.load(x_ptrs + 128, mask=m_in[None, :], other=0.0)
    s_lo = tl.load(s_ptrs, mask=n_in, other=0.0)
    s_hi = tl.load(s_ptrs + N, mask=n_in, other=0.0)
    if SUMS == 1:
        g_lo = tl.load(g_ptrs, mask=m_in, other=0.0)
        g_hi = tl.load(g_ptrs + 1, mask=m_in, other=0.0)
    elif SUMS == 0:
        g_lo = tl.sum(x_lo.to(tl.float32), axis=0) * (1.0 / 64.0)
        g_hi = tl.sum(x_hi.to(tl.float32), axis=0) * (1.0 / 64.0)
    else:  # 2: the sums on the tensor cores (below); 3: signed codes, no sums
        g_lo = s_lo  # unused
        g_hi = s_hi
    return p, x_lo, x_hi, s_lo, s_hi, g_lo, g_hi


@triton.jit
def _nibbles(p, ASM: tl.constexpr, SIGNED: tl.constexpr):
    """The code bytes ``p`` split into their low and high halves, each read as float8 (``c * 2^-9``). ``ASM``: on
    four bytes at a time (one 32-bit mask, one shift and mask), not byte by byte. ``SIGNED``: a half's top bit
    moved to the byte's sign bit."""
    if SIGNED:
        if ASM:
            lo, hi = tl.inline_asm_elementwise(
                "{ .reg .b32 t, s, m; and.b32 s, $2, 0x08080808; shl.b32 s, s, 4; and.b32 m, $2, 0x07070707; "
                "or.b32 $0, m, s; shr.b32 t, $2, 4; and.b32 s, t, 0x08080808; shl.b32 s, s, 4; "
                "and.b32 m, t, 0x07070707; or.b32 $1, m, s; }",
                "=r,=r,r", [p], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
        else:
            lo = ((p & 8) << 4) | (p & 7)
            hi = (((p >> 4) & 8) << 4) | ((p >> 4) & 7)
    elif ASM:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; and.b32 $0, $2, 0x0F0F0F0F; shr.b32 t, $2, 4; and.b32 $1, t, 0x0F0F0F0F; }",
            "=r,=r,r", [p], dtype=(tl.uint8, tl.uint8), is_pure=True, pack=4)
    else:
        lo = p & 15
        hi = p >> 4
    return lo.to(tl.float8e4nv, bitcast=True), hi.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _chunk_acc(acc, p, x_lo, x_hi, s_lo, s_hi, g_lo, g_hi, ASM: tl.constexpr, SUMS: tl.constexpr):
    lo, hi = _nibbles(p, ASM, SUMS == 3)
    d_lo = tl.dot(lo, x_lo)
    d_hi = tl.dot(hi, x_hi)
    if SUMS == 3:
        acc = acc + s_lo[:, None] * d_lo + s_hi[:, None] * d_hi
    elif SUMS == 2:  # sum_k x_k / 64 for every output: a tile of 2^-6 (e4m3 0x08) times the rows
        sixty4th = tl.full(lo.shape, 8, tl.uint8).to(tl.float8e4nv, bitcast=True)
        acc = acc + s_lo[:, None] * (d_lo - tl.dot(sixty4th, x_lo)) + s_hi[:, None] * (d_hi - tl.dot(sixty4th, x_hi))
    else:
        acc = acc + s_lo[:, None] * (d_lo - g_lo[None, :]) + s_hi[:, None] * (d_hi - g_hi[None, :])
    return acc


@triton.jit
def _int4_kernel(q_ptr, xs_ptr, p_ptr, s_ptr, g_ptr, y_ptr, M, N, K, K_PER, HALF_PER, stride_pn, stride_ys,
                 SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, AHEAD: tl.constexpr,
                 SUMS: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``(pid_n, pid_k)``: ``y[m, n] = xs[m] * sum_k q[m, k] w[n, k]`` over split ``pid_k`` of ``K``
    (float32 partials when ``SPLIT > 1``). ``AHEAD`` chunks' loads are issued before a chunk's product (0: the
    compiler's pipelining alone); ``SUMS``: the sign's handling (the module's modes 0-3; mode 1 reads the rows'
    per-group sums / 64 from ``g [M, K / 128]``)."""
    pdl_start(PDL)
    pid_k = tl.program_id(1)
    k0, n, m = pid_k * K_PER, tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_M)
    n_in, m_in, jj = n < N, m < M, tl.arange(0, 128)
    G = K // 128
    p_ptrs = p_ptr + n[:, None].to(tl.int64) * stride_pn + (pid_k * HALF_PER + jj)[None, :]
    x_ptrs = q_ptr + m[None, :].to(tl.int64) * K + (k0 + jj)[:, None]
    s_ptrs = s_ptr + (k0 // 128) * N + n
    g_ptrs = g_ptr + m * G + k0 // 128
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    chunks = tl.minimum(K_PER, K - k0) // 256  # the last split may be shorter
    if AHEAD == 0:
        for _ in range(0, chunks):
            p, xl, xh, sl, sh, gl, gh = _chunk_load(p_ptrs, x_ptrs, s_ptrs, g_ptrs, N, n_in, m_in, chunks, SUMS)
            acc = _chunk_acc(acc, p, xl, xh, sl, sh, gl, gh, ASM, SUMS)
            p_ptrs += 128
            x_ptrs += 256
            s_ptrs += 2 * N
            g_ptrs += 2
    else:
        p, xl, xh, sl, sh, gl, gh = _chunk_load(p_ptrs, x_ptrs, s_ptrs, g_ptrs, N, n_in, m_in, chunks, SUMS)
        if AHEAD == 2:
            p2, xl2, xh2, sl2, sh2, gl2, gh2 = _chunk_load(p_ptrs + 128, x_ptrs + 256, s_ptrs + 2 * N, g_ptrs + 2,
                                                           N, n_in, m_in, chunks - 1, SUMS)
        for i in range(0, chunks):
            nxt = i + AHEAD
            p3, xl3, xh3, sl3, sh3, gl3, gh3 = _chunk_load(p_ptrs + AHEAD * 128, x_ptrs + AHEAD * 256,
                                                           s_ptrs + AHEAD * 2 * N, g_ptrs + AHEAD * 2, N, n_in, m_in,
                                                           chunks - nxt, SUMS)
            acc = _chunk_acc(acc, p, xl, xh, sl, sh, gl, gh, ASM, SUMS)
            if AHEAD == 2:
                p, xl, xh, sl, sh, gl, gh = p2, xl2, xh2, sl2, sh2, gl2, gh2
                p2, xl2, xh2, sl2, sh2, gl2, gh2 = p3, xl3, xh3, sl3, sh3, gl3, gh3
            else:
                p, xl, xh, sl, sh, gl, gh = p3, xl3, xh3, sl3, sh3, gl3, gh3
            p_ptrs += 128
            x_ptrs += 256
            s_ptrs += 2 * N
            g_ptrs += 2
    acc = acc * tl.load(xs_ptr + m, mask=m_in, other=0.0)[None, :]
    out = n_in[:, None] & m_in[None, :]
    if SPLIT == 1:
        tl.store(y_ptr + m[None, :] * N + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=out)
    else:
        tl.store(y_ptr + pid_k * stride_ys + m[None, :] * N + n[:, None], acc, mask=out)


def group_sums(q: torch.Tensor) -> torch.Tensor:
    """``[rows, K / 128]`` float32: each row's float8 codes summed per group, over 64 (the kernel's ``SUMS``)."""
    return (q.float().view(q.shape[0], -1, GROUP).sum(-1) / 64).contiguous()


def int4_product(q, xs, packed, s512, dtype, cfg=(64, 1, 4, 3, 0), sums=None, asm=None, mode=None) -> torch.Tensor:
    """``[rows, N]``: the float8 rows ``q [rows, K]`` (scales ``xs``) times the 4-bit weights; ``cfg`` is
    ``(BLOCK_N, SPLIT, num_warps, num_stages, AHEAD)``; ``mode`` the kernel's ``SUMS`` (default: 1 when the rows'
    :func:`group_sums` are given as ``sums``, else 0); ``asm``: split the codes in inline PTX (default: on CUDA)."""
    block_n, split, warps, stages, ahead = cfg
    asm = q.is_cuda if asm is None else asm  # inline PTX on the GPU (the interpreter runs the plain ops)
    rows, k = q.shape
    n = packed.shape[0]
    y = torch.empty(rows, n, dtype=dtype, device=q.device)
    assert k % 256 == 0, k
    k_per = -(-k // (256 * split)) * 256
    target = y if split == 1 else torch.empty(split, rows, n, dtype=torch.float32, device=q.device)
    _int4_kernel[(triton.cdiv(n, block_n), split)](
        q, xs, packed, s512, sums if sums is not None else xs, target, rows, n, k, k_per, k_per // 2,
        packed.stride(0), rows * n,
        SPLIT=split, BLOCK_M=max(16, triton.next_power_of_2(rows)), BLOCK_N=block_n, AHEAD=ahead,
        SUMS=mode if mode is not None else int(sums is not None), ASM=asm, num_warps=warps, num_stages=stages,
        **pdl_launch())
    if split > 1:
        _skinny_reduce_kernel[(triton.cdiv(rows * n, 1024),)](target, s512, y, rows * n, n, rows * n, HAS_BIAS=False,
                                                              SPLIT=split, BLOCK=1024, num_warps=4, **pdl_launch())
    return y


def check(dev: str, shapes) -> float:
    """Largest error of the kernel against the float64 product of the same rounded operands, relative to the
    output's largest magnitude; ``shapes``: ``((N, K), rows, cfg, mode)``, ``mode`` the kernel's ``SUMS``."""
    worst = 0.0
    gen = torch.Generator(device=dev).manual_seed(0)
    for (n, k), rows, cfg, mode in shapes:
        w = torch.randn(n, k, device=dev, generator=gen) * 0.02
        packed, s512 = pack_int4(w, signed=mode == 3)
        x = torch.randn(rows, k, device=dev, generator=gen).to(torch.bfloat16)
        q, xs = quantize_fp8_rows(x)
        y = int4_product(q, xs, packed, s512, torch.float32, cfg, group_sums(q) if mode == 1 else None, mode=mode)
        w4 = unpack_int4(packed, s512, signed=mode == 3)
        ref = (q.double() * xs.double()[:, None]) @ w4.double().T
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        rel_w = ((w4 - w).norm() / w.norm()).item()
        print(f"check {n}x{k} rows {rows} cfg {cfg} mode {mode}: max err / max |y| {err:.2e} (weights' rounding "
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
        worst = check("cpu", [((128, 512), 4, (64, 1, 4, 3, 0), 1), ((256, 512), 10, (64, 1, 4, 3, 0), 0),
                              ((320, 1024), 7, (64, 2, 4, 3, 1), 2), ((96, 768), 3, (32, 2, 4, 2, 2), 3),
                              ((64, 1280), 5, (64, 3, 4, 2, 0), 2), ((64, 256), 5, (64, 1, 4, 2, 2), 1)])
        print("worst", worst)
        assert worst < 1e-5, worst
        return
    chain = _chain_tools()
    t0 = time.time()
    worst = check("cuda", [((4096, 4096), 10, (64, 1, 4, 3, 0), 0), ((8192, 4096), 7, (64, 2, 4, 3, 0), 1),
                           ((4096, 11008), 10, (64, 3, 4, 3, 0), 2), ((4096, 8192), 10, (64, 4, 4, 3, 0), 3)])
    res = {"check_worst": worst}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in chain.HEAD.items():
        ws8 = [(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen).to(FP8_DTYPE),
                torch.rand(n, device="cuda") + 0.5) for _ in range(16)]
        ws4 = [pack_int4(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen)) for _ in range(16)]
        ws4s = [pack_int4(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen), signed=True)
                for _ in range(16)]
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
            sums = torch.zeros(rows, k // GROUP, device="cuda")  # the rows' group sums, made with the rows
            for mode, stages, bn, split in itertools.product((3, 2, 1, 0), (3, 4, 2, 5), (64, 32, 128), (1, 2, 3, 4)):
                if time.time() - t0 > args.deadline:
                    continue
                cfg = (bn, split, 8 if bn == 128 else 4, stages, 0)
                product = (lambda q, s, i, c=cfg, g=sums if mode == 1 else None, md=mode:
                           int4_product(q, s, *(ws4s if md == 3 else ws4)[i], torch.bfloat16, c, g, mode=md))
                try:
                    row[str(cfg[:4] + (mode,))] = chain.graph_us(run(product), 16)
                except Exception as err:  # noqa: BLE001 - a configuration the compiler refuses
                    print(name, cfg, "failed", str(err)[:100], flush=True)
            sweep = {key: row[key] for key in row if key[0] == "("}
            best = min(sweep, key=sweep.get, default=None)
            res[f"{name} {rows}"] = {**row, "best": best}
            net = lambda v: v - row["base"]  # noqa: E731
            print(f"{name:8s} rows {rows:2d}: base {row['base']:5.1f}  fp8 {net(row['fp8']):5.1f} us "
                  f"({n * k / net(row['fp8']) / 1e6:4.2f} TB/s)  int4 best {best} {net(sweep.get(best, 1e9)):5.1f} us "
                  f"({n * k / 2 / net(sweep.get(best, 1e9)) / 1e6:4.2f} TB/s)  [{time.time() - t0:.0f}s]", flush=True)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
