"""Session 33: tree attention's merge inside the split kernel (``fused_merge``, one launch) against the merge launch
(two launches), on the H200.

For each shape (the 7B verify at batch 1: 32 heads of 128, 61 queries over 573 live keys of a 1,216-slot cache;
an EAGLE head's 10-node level over the same keys; the fixture's verify: 5 heads of 64, 61 queries over ~320 keys),
a CUDA graph of 32 dependent calls (each call's queries are the previous call's output, as layers chain) is
captured both ways and replayed interleaved: us per call (medians over ``--reps`` replays of each), the largest
difference between the two outputs, and the counters left at zero.

    python docs/results/fast_s33/scripts/fused_merge_ab.py --out $OUT/fused_merge.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
from specdec.graphs import capture_graph, capture_graph_ref  # noqa: E402
from specdec.kernels import pdl_enabled, tree_attention_launch  # noqa: E402

ta = importlib.import_module("specdec.kernels.tree_attention")

SHAPES = {"7B verify, batch 1": (1, 32, 61, 1216, 573, 128), "7B head level, batch 1": (1, 32, 10, 1216, 580, 128),
          "7B head level, batch 4": (4, 32, 10, 1216, 580, 128), "fixture verify": (1, 5, 61, 512, 320, 64)}


def make_inputs(B: int, H: int, M: int, S: int, live: int, d: int, dev, dtype):
    """Random ``q [B, H, M, d]``, ``k, v [B, H, S, d]``, a ``[B, 1, M, S]`` mask whose last ``M`` live columns hold
    a random lower-triangular tree (everything before them visible) and ``kv_end = live`` per row."""
    g = torch.Generator(device=dev).manual_seed(0)
    kw = dict(device=dev, dtype=dtype)
    q = torch.randn(B, H, M, d, generator=g, **kw)
    k, v = (torch.randn(B, H, S, d, generator=g, **kw) for _ in range(2))
    mask = torch.zeros(B, 1, M, S, **kw)
    mask[..., live - M:live] = torch.where(torch.rand(M, M, device=dev, generator=g) < 0.5, 0.0,
                                           torch.finfo(torch.bfloat16).min).tril().to(dtype)
    return q, k, v, mask, torch.full((B,), live, device=dev)


def chain(q, k, v, mask, kv_end, fused: bool, layers: int = 32):
    def run(q, k, v, mask, kv_end):
        x = q
        for _ in range(layers):
            x = ta._tree_attention_triton(x, k, v, mask, None, kv_end=kv_end, fused_merge=fused)
        return x
    return (capture_graph if q.is_cuda else capture_graph_ref)(run, (q, k, v, mask, kv_end))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU (TRITON_INTERPRET=1), one tiny shape, 2 layers")
    args = ap.parse_args()
    dev, layers = ("cpu", 2) if args.smoke else ("cuda", 32)
    shapes = {"tiny": (1, 2, 10, 128, 100, 16)} if args.smoke else SHAPES
    res = {"pdl": pdl_enabled(), "layers": layers}
    for name, (B, H, M, S, live, d) in shapes.items():
        q, k, v, mask, kv_end = make_inputs(B, H, M, S, live, d, dev, torch.float32 if args.smoke else torch.bfloat16)
        plan = tree_attention_launch(B * H, M, live, d)
        if plan[1] == 1 and not args.smoke:
            print(f"{name}: one launch (no merge) in this plan; skipped", flush=True)
            continue
        steps = {f: chain(q, k, v, mask, kv_end, f, layers) for f in (False, True)}
        outs = {f: steps[f](q, k, v, mask, kv_end) for f in (False, True)}
        times = {False: [], True: []}
        for _ in range(args.reps):
            for f in (False, True):
                if args.smoke:
                    t = time.perf_counter()
                    steps[f](q, k, v, mask, kv_end)
                    times[f].append(1e6 * (time.perf_counter() - t) / layers)
                    continue
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                steps[f](q, k, v, mask, kv_end)
                end.record()
                end.synchronize()
                times[f].append(1e3 * start.elapsed_time(end) / layers)
        res[name] = {"plan (BLOCK_M, splits, BLOCK_S, warps, stages)": plan,
                     "two launches us/call": round(statistics.median(times[False]), 2),
                     "fused us/call": round(statistics.median(times[True]), 2),
                     "max |difference|": float((outs[True].float() - outs[False].float()).abs().max()),
                     "counters at zero": not ta._COUNTERS[(q.device.type, q.device.index)].any().item()}
        print(f"{name:24s}", json.dumps(res[name]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
