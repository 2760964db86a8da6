"""The one-row linear kernel (``specdec.kernels.linear_rows``) against cuBLAS; the fused decoder with and without it.

GPU only. Three parts, each timed as CUDA-graph replays (so host launch costs do not count):

1. every Llama-2-7B projection shape (``[q;k;v]``, ``o``, ``[gate;up]``, ``down``, ``lm_head``) at 1, 4 and 16 rows:
   ``F.linear`` (cuBLAS), the kernel with :func:`~specdec.kernels.gemv_config`'s blocks, and the best of a small
   sweep of blocks (what ``gemv_config`` was set from);
2. the 7B-shape :class:`~specdec.fused.FusedDecoder` plain forward (random weights, context 520 of 640 slots) at
   batch 1, 4 and 16 with the kernel off (``gemv_rows=0``) and on for up to 16 rows;
3. a per-kernel profile of the batch-1 forward, both ways (kernel names, calls, GPU microseconds).

Session 10's run on an H200 is in ``docs/results/fast_s10/gemv_microbench.{txt,json}`` (the fused decoder there
ran outside a captured step's block, so attention used the memory-efficient kernel, not cuDNN).

Example::

    python examples/bench_gemv.py --out runs/gemv
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

SHAPES = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32000, 4096)]
SWEEP = [(bn, bk, w) for bn in (4, 8, 16, 32) for bk in (128, 256, 512, 1024) for w in (4, 8)]


def graph_ms(fn, n: int = 20, reps: int = 20) -> float:
    """Median ms of one ``fn()`` call, from replays of a CUDA graph holding ``n`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / n)
    return statistics.median(times)


def shape_row(rows: int, n: int, k: int, dtype) -> dict:
    """cuBLAS, the kernel's default blocks and the best swept blocks for ``rows`` rows of an ``[n, k]`` weight."""
    from specdec.kernels.gemv import _linear_rows_triton, gemv_config

    w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    cublas = graph_ms(functools.partial(F.linear, x, w))
    err = (_linear_rows_triton(x, w, None) - F.linear(x, w)).abs().max().item()
    default = graph_ms(functools.partial(_linear_rows_triton, x, w, None))
    best = (default, gemv_config(rows, n, k))
    for config in SWEEP:
        if rows * config[0] * config[1] <= 32768:
            best = min(best, (graph_ms(functools.partial(_linear_rows_triton, x, w, None, config), n=10, reps=10),
                              config))
    gb = n * k * w.element_size() / 1e9
    return dict(rows=rows, n=n, k=k, cublas_us=1e3 * cublas, kernel_us=1e3 * default,
                kernel_config=gemv_config(rows, n, k), best_us=1e3 * best[0], best_config=best[1],
                max_abs_err=err, cublas_TBps=gb / cublas, kernel_TBps=gb / default, best_TBps=gb / best[0])


def bench_shapes(rows_list, dtype) -> list[dict]:
    out = []
    for rows in rows_list:
        for n, k in SHAPES:
            row = shape_row(rows, n, k, dtype)
            out.append(row)
            print(f"rows={rows:2d} {n:5d}x{k:5d}: cuBLAS {row['cublas_us']:6.1f} us ({row['cublas_TBps']:.2f} TB/s)  "
                  f"kernel {row['kernel_us']:6.1f} ({row['kernel_TBps']:.2f})  best {row['best_us']:6.1f} "
                  f"({row['best_TBps']:.2f}) {row['best_config']}", flush=True)
    return out


def bench_decoder(batches, dtype, profile: bool) -> list[dict]:
    from bench_fast_7b import LLAMA2_7B, build_target

    from specdec.fused import FusedDecoder
    from specdec.static import slot_cache

    model = build_target(LLAMA2_7B, "cuda", dtype)
    slots_total, pos = 640, 520
    out = []
    for batch in batches:
        cache = slot_cache(FusedDecoder.cache_shapes(model, batch, slots_total), torch.device("cuda"))
        tok = torch.randint(0, LLAMA2_7B["vocab_size"], (batch, 1), device="cuda")
        positions = torch.full((batch, 1), pos, device="cuda")
        mask = torch.zeros(batch, 1, 1, slots_total, device="cuda", dtype=dtype)
        mask[..., pos + 1:] = torch.finfo(dtype).min
        slots = torch.tensor([pos], device="cuda")
        row = dict(batch=batch)
        for rows in (0, 16):
            dec = FusedDecoder(model, 4096, gemv_rows=rows)
            forward = torch.no_grad()(functools.partial(dec, tok, positions, mask, slots, cache.layers))
            row[f"gemv_rows_{rows}_ms"] = graph_ms(forward, n=5, reps=10)
            if profile and batch == 1:
                row[f"profile_gemv_rows_{rows}"] = kernel_profile(forward)
        out.append(row)
        print(f"decoder batch {batch}: kernel off {row['gemv_rows_0_ms']:.3f} ms, on {row['gemv_rows_16_ms']:.3f} "
              "ms", flush=True)
        del cache
        torch.cuda.empty_cache()
    return out


def kernel_profile(fn, reps: int = 5) -> list[dict]:
    """GPU time per kernel name over ``reps`` calls (per call), largest first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:80]][0] += 1
            agg[e.name[:80]][1] += getattr(e, "device_time_total", 0.0)
    rows = [dict(kernel=k, calls=c / reps, us=t / reps) for k, (c, t) in agg.items()]
    rows.sort(key=lambda r: -r["us"])
    print(f"  profile: {sum(r['us'] for r in rows) / 1e3:.3f} ms GPU, {sum(r['calls'] for r in rows):.0f} kernels")
    for r in rows[:12]:
        print(f"    {r['us']:8.1f} us {r['calls']:5.1f}x  {r['kernel']}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16], help="rows of the per-shape part")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="batches of the decoder part")
    parser.add_argument("--no-decoder", action="store_true", help="only the per-shape part (no 7B model built)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--out", default=None, help="folder for gemv.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemv.py needs a CUDA GPU (the kernel's CPU form is the Triton interpreter: no timing)",
              file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    print(torch.__version__, torch.cuda.get_device_name())
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shapes": bench_shapes(args.rows, dtype)}
    torch.cuda.empty_cache()
    if not args.no_decoder:
        result["decoder"] = bench_decoder(args.batches, dtype, not args.no_profile)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gemv.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
