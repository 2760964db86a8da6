"""Session 44: the draft head's one-program-per-row kernels at the 7B head's shapes (10 rows), by num_warps: SiLU-mul
with float8 output (a 16,384-wide block for 11,008 columns), embed + concat with float8 output (8,192), the row
rounding (4,096) and the residual add + RMSNorm with float8 output (4,096). A chain of 20 dependent launches captured
as a CUDA graph (``captured_time_us``), us per launch; the library's launch first. Also a prototype of SiLU-mul's
rounding in two passes over chunks of the row (the row's largest magnitude first, then the codes, the row read twice
from L2) instead of one 16,384-wide block in registers; its codes and scales must equal the library's.

    python docs/results/fast_s44/scripts/row_warps.py OUT.json
"""
import json
import sys

import torch
import triton
import triton.language as tl

from specdec.kernels._triton import pdl_launch, pdl_start
from specdec.kernels.decoder_ops import _add_rms_norm_kernel, _embed_concat_kernel, _silu_mul_kernel
from specdec.kernels.fp8 import FP8_DTYPE, _quant_rows_kernel, _round_e4m3, _row_scale
from specdec.kernels.tuning import captured_time_us

dev, R, N = "cuda", 10, 20
torch.manual_seed(0)
gu = torch.randn(R, 22016, device=dev, dtype=torch.bfloat16)
q8 = torch.empty(R, 16384, device=dev, dtype=FP8_DTYPE)
sc = torch.empty(R, device=dev)
table = torch.randn(32000, 4096, device=dev, dtype=torch.bfloat16)
ids = torch.randint(0, 32000, (R,), device=dev)
hid = torch.randn(R, 4096, device=dev, dtype=torch.bfloat16)
x = torch.randn(R, 4096, device=dev, dtype=torch.bfloat16)
res = torch.randn(R, 4096, device=dev, dtype=torch.bfloat16)
w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
h = torch.empty_like(x)
kw = pdl_launch()


@triton.jit
def _silu_chunk(gu_ptr, row, s_in, inter, cols):
    """``silu(gate) * up`` of the columns ``cols`` of ``row``, rounded to the dtype as the library rounds it,
    returned in float32 (zeros past ``inter``)."""
    gate = tl.load(gu_ptr + row * s_in + cols, mask=cols < inter, other=0.0)
    up = tl.load(gu_ptr + row * s_in + inter + cols, mask=cols < inter, other=0.0)
    g = gate.to(tl.float32)
    val = ((g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    return val.to(tl.float32)


@triton.jit
def _silu_fp8_two_pass(gu_ptr, out_ptr, s_ptr, inter, s_in, s_out, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program ``row``: ``silu(gate) * up`` (rounded to the dtype) in chunks of ``BLOCK``: the largest magnitude in
    a first pass, the float8 codes in a second (the chunks recomputed)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    top = tl.zeros([BLOCK], tl.float32)
    for start in range(0, inter, BLOCK):
        top = tl.maximum(top, tl.abs(_silu_chunk(gu_ptr, row, s_in, inter, start + offs)))
    inv = _row_scale(tl.max(top, axis=0), s_ptr + row)
    for start in range(0, inter, BLOCK):
        cols = start + offs
        codes = _round_e4m3(_silu_chunk(gu_ptr, row, s_in, inter, cols) * inv)
        tl.store(out_ptr + row * s_out + cols, codes.to(out_ptr.dtype.element_ty), mask=cols < inter)


def silu(nw):
    _silu_mul_kernel[(R, 1)](gu, q8, sc, 11008, gu.stride(0), 11008, BLOCK=16384, FP8=True, num_warps=nw, **kw)


def embed(nw):
    _embed_concat_kernel[(R, 1)](ids, table, hid, q8, sc, 4096, 4096, table.stride(0), hid.stride(0), 8192,
                                 BLOCK=8192, FP8=True, num_warps=nw, **kw)


def quant(nw):
    _quant_rows_kernel[(R,)](x, q8, sc, 4096, x.stride(0), BLOCK=4096, ONE_PASS=True, num_warps=nw, **kw)


def norm(nw):
    _add_rms_norm_kernel[(R,)](x, res, w, h, q8, sc, 4096, 1e-5, x.stride(0), res.stride(0), h.stride(0), 4096,
                               HAS_RESIDUAL=True, BLOCK_H=4096, FP8=True, num_warps=nw, **kw)


def two_pass(nw, block):
    _silu_fp8_two_pass[(R,)](gu, q8b, scb, 11008, gu.stride(0), 11008, BLOCK=block, num_warps=nw, **kw)


q8b, scb = torch.empty_like(q8), torch.empty_like(sc)
silu(8)
two_pass(4, 2048)
flat = R * 11008  # rows packed at a stride of 11,008 codes
same = bool((q8.view(torch.uint8).view(-1)[:flat] == q8b.view(torch.uint8).view(-1)[:flat]).all()
            and (sc == scb).all())
print("two-pass SiLU-mul codes and scales equal the library's:", same, flush=True)
out = {"two_pass_equal": same}
if same:
    row = {}
    for block in (1024, 2048, 4096):
        for nw in (4, 8):
            row[f"{block}/{nw}"] = captured_time_us(lambda: [two_pass(nw, block) for _ in range(N)], 3,
                                                    replays=10) / N
    out["prototype: two-pass SiLU-mul"] = row
    print("silu_mul fp8 two-pass (block/warps): " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
for name, fn, lib in (("silu_mul fp8 [10 x 11008]", silu, 8), ("embed_concat fp8 [10 x 8192]", embed, 8),
                      ("quant_rows [10 x 4096]", quant, 4), ("add_rms_norm fp8 [10 x 4096]", norm, 8)):
    row = {}
    for nw in (lib, 2, 4, 8, 16, 32):
        if str(nw) in row:
            continue
        try:
            row[str(nw)] = captured_time_us(lambda: [fn(nw) for _ in range(N)], 3, replays=10) / N
        except Exception as exc:  # noqa: BLE001
            row[str(nw)] = f"{type(exc).__name__}: {str(exc)[:80]}"
    out[name] = row
    print(f"{name:30s} library {lib} warps: " + "  ".join(
        f"{k}w {v:.2f}" if isinstance(v, float) else f"{k}w {v}" for k, v in row.items()), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
