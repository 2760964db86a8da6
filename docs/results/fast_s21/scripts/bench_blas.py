"""Session 21: cuBLAS against cuBLASLt (torch.backends.cuda.preferred_blas_library) on the 7B verify forward's
linear shapes at 1, 10, 61 and 64 rows (argv[1]: other row counts, comma-separated); CUDA-graph replays cycling
four weight copies per shape (no L2 reuse).
Prints per shape and row count us and TB/s of the weight bytes for both libraries, then per 7B forward
(32 x ([q;k;v], o, [gate;up], down) + lm_head) the sums. Writes $OUT/bench_blas.json."""
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "examples"))
from bench_gemv import graph_ms  # noqa: E402

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
          "lm_head": (32000, 4096), "fc": (4096, 8192), "lm_head_8192": (8192, 4096)}
ROWS = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "1,10,61,64").split(",")]  # call C: 4,16,244,976
COPIES = 4
rows_out, sums = [], {}
for name, (n, k) in SHAPES.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * k ** -0.5 for _ in range(COPIES)]
    for m in ROWS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        res = {}
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            ref = F.linear(x, ws[0])

            def four(x=x, ws=ws):
                for w in ws:
                    F.linear(x, w)
            us = graph_ms(four) * 1e3 / COPIES
            res[lib] = us
            res[lib + "_err"] = (F.linear(x, ws[0]).float() - ref.float()).abs().max().item()
        torch.backends.cuda.preferred_blas_library("cublas")
        mb = 2 * n * k / 1e6
        print(f"M={m:3d} {name:13s} cuBLAS {res['cublas']:7.1f} us ({mb / res['cublas']:.2f} TB/s)   cuBLASLt "
              f"{res['cublaslt']:7.1f} us ({mb / res['cublaslt']:.2f} TB/s)", flush=True)
        rows_out.append(dict(shape=name, n=n, k=k, rows=m, **res))
        per = 32 if name in ("qkv", "o", "gate_up", "down") else int(name == "lm_head")
        for lib in ("cublas", "cublaslt"):
            sums[(m, lib)] = sums.get((m, lib), 0.0) + per * res[lib]
    del ws

def per_forward(shape: str) -> int:
    """Calls of a shape per 7B forward: 32 layers' projections, one lm_head, no head shape."""
    return 32 if shape in ("qkv", "o", "gate_up", "down") else int(shape == "lm_head")


for m in ROWS:
    best = sum(per_forward(r["shape"]) * min(r["cublas"], r["cublaslt"]) for r in rows_out if r["rows"] == m)
    print(f"one 7B forward's linears, M={m}: cuBLAS {sums[(m, 'cublas')] / 1e3:.3f} ms, cuBLASLt "
          f"{sums[(m, 'cublaslt')] / 1e3:.3f} ms, best per shape {best / 1e3:.3f} ms")
with open(os.path.join(os.environ.get("OUT", "."), f"bench_blas_{len(ROWS)}_{ROWS[-1]}.json"), "w") as f:
    json.dump(rows_out, f, indent=1)
