"""Session 24: can a draft head's linears run on int4 weights (groups of 128 along K, one float32 scale each,
two codes per byte: byte j of a group holds k = j (low nibble) and k = j + 64 (high)) faster than on float8?
A Triton prototype at the 7B EAGLE head's six matrices, 10 rows, weights cycled past L2 (CUDA-graph replays),
against linear_skinny (bf16) and linear_fp8 (rows rounded + float8 product) in the same run."""
import itertools
import json
import sys

import torch
import triton
import triton.language as tl

from specdec.kernels.fp8 import linear_fp8, quantize_fp8_rows
from specdec.kernels.skinny import linear_skinny


@triton.jit
def _int4_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, G, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 MAGIC: tl.constexpr, W_IS_A: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    n_in, m_in = n < N, m < M
    jj = tl.arange(0, 64)
    per = G // SPLIT
    g0 = pid_k * per
    if W_IS_A:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        w_ptrs = w_ptr + n[:, None].to(tl.int64) * (K // 2) + g0 * 64 + jj[None, :]
        x_ptrs = x_ptr + m[None, :] * K + g0 * 128 + jj[:, None]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_ptrs = w_ptr + n[None, :].to(tl.int64) * (K // 2) + g0 * 64 + jj[:, None]
        x_ptrs = x_ptr + m[:, None] * K + g0 * 128 + jj[None, :]
    for g in range(g0, g0 + per):
        if W_IS_A:
            p = tl.load(w_ptrs, mask=n_in[:, None], other=0)
            xl = tl.load(x_ptrs, mask=m_in[None, :], other=0.0)
            xh = tl.load(x_ptrs + 64, mask=m_in[None, :], other=0.0)
        else:
            p = tl.load(w_ptrs, mask=n_in[None, :], other=0)
            xl = tl.load(x_ptrs, mask=m_in[:, None], other=0.0)
            xh = tl.load(x_ptrs + 64, mask=m_in[:, None], other=0.0)
        if MAGIC:
            p16 = p.to(tl.int16)
            lo = ((p16 & 15) | 0x4300).to(tl.bfloat16, bitcast=True) - 136.0
            hi = ((p16 >> 4) | 0x4300).to(tl.bfloat16, bitcast=True) - 136.0
            lo = lo.to(tl.bfloat16)
            hi = hi.to(tl.bfloat16)
        else:
            lo = ((p & 15).to(tl.int8) - 8).to(tl.bfloat16)
            hi = ((p >> 4).to(tl.int8) - 8).to(tl.bfloat16)
        s = tl.load(s_ptr + g * N + n, mask=n_in, other=0.0)
        if W_IS_A:
            part = tl.dot(lo, xl)
            part = tl.dot(hi, xh, part)
            acc += part * s[:, None]
        else:
            part = tl.dot(xl, lo)
            part = tl.dot(xh, hi, part)
            acc += part * s[None, :]
        w_ptrs += 64
        x_ptrs += 128
    if W_IS_A:
        out = y_ptr + pid_k * M * N + m[None, :] * N + n[:, None]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=n_in[:, None] & m_in[None, :])
    else:
        out = y_ptr + pid_k * M * N + m[:, None] * N + n[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_in[:, None] & n_in[None, :])


def quantize(w):
    N, K = w.shape
    g = w.float().view(N, K // 128, 128)
    s = (g.abs().amax(-1) / 7.0).clamp_min(1e-12)
    q = torch.clamp(torch.round(g / s[..., None]), -8, 7).to(torch.int16) + 8  # [N, G, 128]
    packed = (q[..., :64] | (q[..., 64:] << 4)).to(torch.uint8).reshape(N, K // 2)
    return packed.contiguous(), s.t().contiguous(), ((q - 8).float() * s[..., None]).view(N, K)


def int4_linear(x, packed, s, cfg, out=None):
    M, K = x.shape
    N = packed.shape[0]
    block_n, warps, stages, magic, w_is_a, split = cfg
    G = K // 128
    y = out if out is not None else torch.empty(split, M, N, device=x.device,
                                                dtype=x.dtype if split == 1 else torch.float32)
    _int4_kernel[(triton.cdiv(N, block_n), split)](x, packed, s, y, M, N, K, G, BLOCK_M=16, BLOCK_N=block_n,
                                                   MAGIC=magic, W_IS_A=w_is_a, SPLIT=split, num_warps=warps,
                                                   num_stages=stages)
    return y[0] if split == 1 else y.sum(0).to(x.dtype)


def timed(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps


dev, dt = "cuda", torch.bfloat16
SHAPES = {"fc": (4096, 8192), "qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096),
          "down": (4096, 11008), "lm_fr": (8192, 4096)}
COPIES, ROWS = 4, 10
torch.manual_seed(0)
res = {}
tot = {"bf16": 0.0, "fp8": 0.0, "int4": 0.0}
grid = list(itertools.product((64, 128), (4, 8), (3, 5), (0, 1), (1, 0), (1, 2)))
for name, (N, K) in SHAPES.items():
    ws = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(COPIES)]
    x = torch.randn(ROWS, K, device=dev, dtype=dt)
    bf = timed(lambda: [linear_skinny(x, w) for w in ws]) / COPIES
    f8 = [quantize_fp8_rows(w) for w in ws]
    fp = timed(lambda: [linear_fp8(x, a, b) for a, b in f8]) / COPIES
    q4 = [quantize(w) for w in ws]
    ws = None
    ref = x.float() @ q4[0][2].t()
    rows = []
    for cfg in grid:
        if cfg[5] == 2 and (K // 128) % 2:
            continue
        try:
            y = int4_linear(x, q4[0][0], q4[0][1], cfg)
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            us = timed(lambda: [int4_linear(x, p, s, cfg) for p, s, _ in q4]) / COPIES
        except Exception as exc:  # noqa: BLE001
            print("  fail", name, cfg, type(exc).__name__, str(exc)[:120], flush=True)
            continue
        rows.append((us, cfg, err))
    rows.sort()
    best = rows[0]
    mb = N * K / 2 / 1e6
    print(f"{name:8s} bf16 {bf:6.1f}  fp8 {fp:6.1f}  int4 best {best[0]:6.1f} us ({mb / best[0]:.2f} TB/s of codes) "
          f"cfg {best[1]} err {best[2]:.4f}; next {[(round(r[0], 1), r[1]) for r in rows[1:4]]}", flush=True)
    res[name] = dict(bf16=bf, fp8=fp, int4=[dict(us=r[0], cfg=r[1], err=r[2]) for r in rows])
    tot["bf16"] += bf
    tot["fp8"] += fp
    tot["int4"] += best[0]
    q4 = f8 = None
print("sum over the six: " + ", ".join(f"{k} {v:.1f} us" for k, v in tot.items()))
json.dump(res, open(sys.argv[1] if len(sys.argv) > 1 else "int4.json", "w"), indent=1)
