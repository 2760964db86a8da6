"""Session 14: linear_skinny's launch sweep against cuBLAS (F.linear) on Llama-2-7B's verify and head shapes.

bf16, CUDA-graph replays (tune_attn.graph_us). Prints cuBLAS, the default config and the best five per shape with
the bandwidth each
reaches (weight bytes / time: GB/s, mislabelled TB/s in call 2's output); writes every row to $OUT/tune_skinny.json.
"""
import functools
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from skinny_kernel import _linear_skinny_triton, skinny_config  # noqa: E402
from tune_attn import graph_us  # noqa: E402  (NB: importing tune_attn runs its sweep too, as call 2 did)

SHAPES = {  # name: (rows, N, K)
    "verify_qkv": (64, 12288, 4096), "verify_o": (64, 4096, 4096), "verify_gate_up": (64, 22016, 4096),
    "verify_down": (64, 4096, 11008), "verify_lm_head": (64, 32000, 4096),
    "head_q": (10, 4096, 4096), "head_gate": (10, 11008, 4096),
    "head_down": (10, 4096, 11008), "head_fc": (10, 4096, 8192),
}


def timed(x, w, config):
    try:
        return graph_us(functools.partial(_linear_skinny_triton, x, w, None, config))
    except Exception:  # out of shared memory: not a candidate
        return float("nan")


rows = []
for name, (m, n, k) in SHAPES.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5
    gb = n * k * 2 / 1e3  # weight bytes / 1e3: GB/s per us -> TB/s
    err = (_linear_skinny_triton(x, w, None).float() - F.linear(x.float(), w.float())).abs().max().item()
    cublas = graph_us(functools.partial(F.linear, x, w))
    default = timed(x, w, None)
    found = []
    for bn, bk, split, warps, stages in itertools.product((32, 64, 128), (64, 128), (1, 2, 4), (4, 8), (3, 4)):
        found.append(dict(shape=name, config=[bn, bk, split, warps, stages], us=timed(x, w, (bn, bk, split, warps,
                                                                                              stages))))
    ok = sorted((r for r in found if r["us"] == r["us"]), key=lambda r: r["us"])
    print(f"== {name} (M={m}, N={n}, K={k}): cuBLAS {cublas:.1f} us ({gb / cublas:.0f} GB/s); default "
          f"{skinny_config(m, n, k)} {default:.1f} us; max err {err:.3f}")
    for r in ok[:5]:
        print(f"   {tuple(r['config'])}  {r['us']:6.1f} us  {gb / r['us']:.0f} GB/s")
    rows += found + [dict(shape=name, config="cublas", us=cublas), dict(shape=name, config="default", us=default)]
with open(os.path.join(os.environ.get("OUT", "."), "tune_skinny.json"), "w") as f:
    json.dump(rows, f, indent=0)
