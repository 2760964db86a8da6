"""Session 35: tree attention's launch plans for the 7B verify and head shapes, timed side by side (H200).

For each shape (session 33's ``fused_merge_ab.py`` shapes, with the step's dense-row bound ``visible_end`` as the
fast path passes it), a CUDA graph of 32 dependent calls per plan, replayed interleaved: the default plan (key
chunks merged in a second launch), its merge inside the split kernel (``fused_merge``), and one-launch plans with
no key split (``num_splits=1``: every program walks all keys of its head for 16 or 32 queries, so more programs per
head). us per call (medians over ``--reps`` replays), and the largest difference from the default's output.

    python docs/results/fast_s35/scripts/attn_configs_ab.py --out $OUT/attn_configs.json
    TRITON_INTERPRET=1 python docs/results/fast_s35/scripts/attn_configs_ab.py --smoke
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
sys.path[:0] = [ROOT, os.path.join(ROOT, "docs", "results", "fast_s33", "scripts")]
from fused_merge_ab import SHAPES as S33_SHAPES  # noqa: E402
from fused_merge_ab import make_inputs  # noqa: E402  (session 33's shapes and inputs)

from specdec.graphs import capture_graph, capture_graph_ref  # noqa: E402
from specdec.kernels import pdl_enabled, tree_attention_launch  # noqa: E402

ta = importlib.import_module("specdec.kernels.tree_attention")

SHAPES = {name: S33_SHAPES[name] for name in ("7B verify, batch 1", "7B head level, batch 1", "fixture verify")}
VARIANTS = {"default": {}, "fused merge": dict(fused_merge=True),
            "direct m16 s64": dict(block_m=16, num_splits=1, tile_s=64, num_warps=4, num_stages=3),
            "direct m16 s32": dict(block_m=16, num_splits=1, tile_s=32, num_warps=4, num_stages=3),
            "direct m32 s64": dict(block_m=32, num_splits=1, tile_s=64, num_warps=4, num_stages=3),
            "4 splits fused": dict(num_splits=4, fused_merge=True),
            # session 36: more key chunks, fewer keys per program (the batch-1 verify's 128 programs walk ~5 tiles)
            "m32 4 splits": dict(block_m=32, num_splits=4, tile_s=64, num_warps=4, num_stages=3),
            "m32 8 splits": dict(block_m=32, num_splits=8, tile_s=64, num_warps=4, num_stages=3),
            "m32 8 splits fused": dict(block_m=32, num_splits=8, tile_s=64, num_warps=4, num_stages=3,
                                       fused_merge=True),
            "m64 4 splits": dict(block_m=64, num_splits=4, tile_s=32, num_warps=4, num_stages=3),
            "m64 8 splits fused": dict(block_m=64, num_splits=8, tile_s=32, num_warps=4, num_stages=3,
                                       fused_merge=True)}


def chain(q, k, v, mask, kv_end, visible_end, kw: dict, layers: int):
    def run(q, k, v, mask, kv_end, visible_end):
        x = q
        for _ in range(layers):
            x = ta._tree_attention_triton(x, k, v, mask, None, kv_end=kv_end, visible_end=visible_end, **kw)
        return x
    return (capture_graph if q.is_cuda else capture_graph_ref)(run, (q, k, v, mask, kv_end, visible_end))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU (TRITON_INTERPRET=1), one tiny shape, 2 layers")
    args = ap.parse_args()
    dev, layers = ("cpu", 2) if args.smoke else ("cuda", 32)
    shapes = {"tiny": (1, 2, 10, 128, 100, 16)} if args.smoke else SHAPES
    res = {"pdl": pdl_enabled(), "layers": layers}
    for name, (B, H, M, S, live, d) in shapes.items():
        q, k, v, mask, kv_end = make_inputs(B, H, M, S, live, d, dev, torch.float32 if args.smoke else torch.bfloat16)
        visible_end = torch.full((B,), live - M, device=dev)
        plan = tree_attention_launch(B * H, M, live, d, visible_prefix=True)
        steps, outs, times = {}, {}, {}
        for v_name, v_kw in VARIANTS.items():
            try:
                steps[v_name] = chain(q, k, v, mask, kv_end, visible_end, v_kw, layers)
                outs[v_name] = steps[v_name](q, k, v, mask, kv_end, visible_end).float()
                times[v_name] = []
            except Exception as e:  # a plan the kernel refuses: recorded, not fatal
                res.setdefault("errors", {})[f"{name} / {v_name}"] = f"{type(e).__name__}: {e}"[:300]
        for _ in range(args.reps):
            for v_name, run in steps.items():
                if args.smoke:
                    t = time.perf_counter()
                    run(q, k, v, mask, kv_end, visible_end)
                    times[v_name].append(1e6 * (time.perf_counter() - t) / layers)
                    continue
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run(q, k, v, mask, kv_end, visible_end)
                end.record()
                end.synchronize()
                times[v_name].append(1e3 * start.elapsed_time(end) / layers)
        res[name] = {"default plan (BLOCK_M, splits, BLOCK_S, warps, stages)": plan}
        for v_name in steps:
            res[name][v_name] = {"us/call": round(statistics.median(times[v_name]), 2),
                                 "max |diff| vs default": float((outs[v_name] - outs["default"]).abs().max())}
        print(f"{name:24s}", json.dumps(res[name]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
