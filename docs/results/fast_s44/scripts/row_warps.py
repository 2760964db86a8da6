"""Session 44: the draft head's one-program-per-row kernels at the 7B head's shapes (10 rows), by num_warps: SiLU-mul
with float8 output (a 16,384-wide block for 11,008 columns), embed + concat with float8 output (8,192), the row
rounding (4,096) and the residual add + RMSNorm with float8 output (4,096). A chain of 20 dependent launches captured
as a CUDA graph (``captured_time_us``), us per launch; the library's launch first.

    python docs/results/fast_s44/scripts/row_warps.py OUT.json
"""
import json
import sys

import torch

from specdec.kernels._triton import pdl_launch
from specdec.kernels.decoder_ops import _add_rms_norm_kernel, _embed_concat_kernel, _silu_mul_kernel
from specdec.kernels.fp8 import FP8_DTYPE, _quant_rows_kernel
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


out = {}
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
