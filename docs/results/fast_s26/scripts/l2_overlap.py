"""Session 26: prefetch the next projection's weights into L2 while attention runs (latency-bound, the memory
mostly idle), so the projection reads them from L2.

Two stacks of 32 Llama-2-7B layers (random weights, bf16, CUDA-graph replays), each layer: norm stand-in, qkv,
rope stand-in, attention, o_proj, norm stand-in, gate_up, SiLU, down; then the lm_head:
- verify: 61 rows, cuBLASLt GEMMs, specdec's tree attention over 573 live of 1,216 slots (the batch-1 verify);
- plain: 1 row, specdec's GEMV kernel, SDPA over 573 keys (the plain step).
A one-program-per-chunk kernel issues ``cp.async.bulk.prefetch.L2`` for the chosen weight bytes just before the
attention (it then waits on its predecessor like every PDL kernel). Variants: no prefetch, o_proj's weights, o_proj's
and the first part of gate_up's.

    python docs/results/fast_s26/scripts/l2_overlap.py --out $OUT/l2_overlap.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(__file__))

from chain_sweep import ew, graph_us  # noqa: E402

from specdec.kernels._triton import pdl_launch, pdl_start  # noqa: E402
from specdec.kernels.gemv import _linear_rows_triton  # noqa: E402
from specdec.kernels.tree_attention import tree_attention  # noqa: E402


@triton.jit
def _bulk_prefetch(row_ptrs, NBYTES: tl.constexpr):
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                              [row_ptrs, tl.full(row_ptrs.shape, NBYTES, tl.int32)], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _pf_kernel(ptr, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    off = tl.minimum(i.to(tl.int64) * CHUNK, nbytes - CHUNK)
    _bulk_prefetch(ptr.to(tl.pointer_type(tl.uint8)) + off, CHUNK)
    pdl_start(PDL)


def prefetch(w: torch.Tensor, nbytes: int, chunk: int = 16384, block: int = 64) -> None:
    nbytes = min(nbytes, w.numel() * w.element_size()) // chunk * chunk
    if nbytes <= 0:
        return
    chunks = nbytes // chunk
    _pf_kernel[(triton.cdiv(chunks, block),)](w, nbytes, CHUNK=chunk, BLOCK=block, num_warps=2, **pdl_launch())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    dev, dt, L, H, d, S, live = "cuda", torch.bfloat16, args.layers, 32, 128, 1216, 573
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.empty(*shape, device=dev, dtype=dt).normal_(0, 0.02, generator=gen)
    layers = [dict(qkv=rnd(12288, 4096), o=rnd(4096, 4096), gu=rnd(22016, 4096), down=rnd(4096, 11008),
                   k=rnd(1, H, S, d), v=rnd(1, H, S, d)) for _ in range(L)]
    lm = rnd(32000, 4096)
    low = torch.finfo(dt).min
    M = 61
    mask = torch.full((1, 1, M, S), low, device=dev, dtype=dt)
    mask[..., :live - M] = 0.0
    anc = torch.rand(M, M, device=dev, generator=gen) < 0.1
    anc.fill_diagonal_(True)
    mask[..., live - M:live] = torch.where(anc, 0.0, low).to(dt)
    kv_end = torch.tensor([live], device=dev)

    def stack(rows, pf_bytes):
        x0 = torch.randn(rows, 4096, device=dev, dtype=dt, generator=gen)
        lin = (lambda x, w: F.linear(x, w)) if rows > 1 else (lambda x, w: _linear_rows_triton(x, w, None))

        def run():
            h = x0
            for lw in layers:
                qkv = lin(ew(h, 4096, 0), lw["qkv"])
                if pf_bytes:
                    prefetch(lw["o"], pf_bytes)
                    if pf_bytes > lw["o"].numel() * 2:
                        prefetch(lw["gu"], pf_bytes - lw["o"].numel() * 2)
                q = ew(qkv, 4096, 0).view(1, rows, H, d).transpose(1, 2)
                if rows > 1:
                    o = tree_attention(q, lw["k"], lw["v"], mask, kv_end=kv_end)
                else:
                    o = F.scaled_dot_product_attention(q, lw["k"][:, :, :live], lw["v"][:, :, :live])
                o = lin(o.transpose(1, 2).reshape(rows, 4096), lw["o"])
                gu = lin(ew(o, 4096, 0), lw["gu"])
                h = lin(ew(gu, 11008, 1), lw["down"])
            return lin(ew(h, 4096, 0), lm)
        return run

    res = {}
    for name, rows in (("verify", 61), ("plain", 1)):
        for pf in (0, 8 << 20, 16 << 20, 32 << 20, 48 << 20):
            for rep in range(2):
                key = f"{name} pf={pf >> 20}MB #{rep}"
                res[key] = graph_us(stack(rows, pf), 1, reps=10) / 1e3
                print(f"{key:28s} {res[key]:.3f} ms", flush=True)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
