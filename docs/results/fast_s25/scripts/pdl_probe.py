"""Session 25: does programmatic dependent launch (PDL) take the launch gaps out of a CUDA graph of small kernels?

A chain of dependent Triton kernels (each adds 1 to a vector the previous one wrote), captured in one graph, timed
per kernel: launched plainly, with PDL and ``gdc_wait`` at the start, and with ``gdc_launch_dependents`` too; then
the same chain with a cuBLAS GEMM (61 x 4096 x 4096, bf16, launched plainly) after every fourth kernel, as the
verify forward interleaves them."""
import json
import sys

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_wait = gdc_launch_dependents = None

print("triton", triton.__version__, "torch", torch.__version__, "gdc", gdc_wait is not None, flush=True)


@triton.jit
def _step(x_ptr, y_ptr, n, WAIT: tl.constexpr, TRIGGER: tl.constexpr, BLOCK: tl.constexpr):
    if WAIT:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)


def chain(bufs, kernels, mode, gemm=None):
    wait, trig = mode in ("wait", "wait+trigger"), mode == "wait+trigger"
    pdl = mode != "plain"
    n = bufs[0].numel()
    block = 1024
    for i in range(kernels):
        x, y = bufs[i % 2], bufs[(i + 1) % 2]
        _step[(triton.cdiv(n, block),)](x, y, n, WAIT=wait, TRIGGER=trig, BLOCK=block, launch_pdl=pdl)
        if gemm is not None and i % 4 == 3:
            a, w, out = gemm
            torch.mm(a, w, out=out)


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(5):
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps)
    return best, g


results = {}
K = 400
for n in (8192, 262144):
    for with_gemm in (False, True):
        gemm = None
        if with_gemm:
            gemm = (torch.randn(61, 4096, device="cuda", dtype=torch.bfloat16),
                    torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16),
                    torch.empty(61, 4096, device="cuda", dtype=torch.bfloat16))
        for mode in ("plain", "wait", "wait+trigger"):
            bufs = [torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")]
            us, g = timed(lambda: chain(bufs, K, mode, gemm))
            # correctness: K increments through the chain on replay, from a known start
            bufs[0].zero_()
            bufs[1].zero_()
            g.replay()
            torch.cuda.synchronize()
            got = bufs[K % 2][0].item()
            key = f"n={n} gemm={with_gemm} {mode}"
            results[key] = dict(us_total=us, us_per_kernel=us / K, value=got, want=float(K))
            print(f"{key:40s} {us:9.1f} us  {us / K:6.3f} us/kernel  value {got:.0f} (want {K})", flush=True)
json.dump(results, open(sys.argv[1] if len(sys.argv) > 1 else "pdl_probe.json", "w"), indent=1)
