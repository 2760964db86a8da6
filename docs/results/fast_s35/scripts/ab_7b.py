"""Session 35: the 7B step's opt-ins timed in one process, interleaved (H200).

On ``bench_fast_7b.py``'s Llama-2-7B shape (random weights, bf16, context 512) and its float8 FR-Spec EAGLE-2
drafter (``DynamicTree(60, 6, 10)``), one process builds, per batch size, the fast plain step and the speculative
step in variants: tree attention's merge in its split kernel or in a second launch (``use_fused_tree_merge``,
chosen at capture) x EAGLE's fold into the verify step on or off (``EagleDrafter(fold=)``); ``direct_*``: tree
attention's key split for 17+ queries (the verify's) replaced by one launch of 16-query programs. Every variant has its
own adapter and drafter (its own captures). Each round re-prefills every variant (context back to 512) and times
it once from an idle device (``--reps`` steps, each between events and a sync) and once with 8 steps queued, the
variants in a rotated order; the figures are medians over rounds, and the ratio to the plain step is the median of
the per-round ratios (the plain step timed in the same round).

    python docs/results/fast_s35/scripts/ab_7b.py --batches 1 --rounds 8 --out $OUT/ab_7b.json
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import bench_fast_7b as b7  # noqa: E402

from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.graphs import cuda_graphed  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.kernels import use_fused_tree_merge  # noqa: E402
from specdec.nn import quantize_fp8_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.trees.dynamic import DynamicTree  # noqa: E402

ta = importlib.import_module("specdec.kernels.tree_attention")
_LAUNCH = ta.tree_attention_launch


def _direct_launch(rows_heads, queries, keys, head_dim, **kw):
    """The library's plan, except that a key split for 17+ queries becomes one launch of 16-query programs (the
    variant ``direct``: no partial sums, no merge)."""
    plan = _LAUNCH(rows_heads, queries, keys, head_dim, **kw)
    return (16, 1, 64, 4, 3) if plan[1] > 1 and queries > 16 else plan


@contextlib.contextmanager
def variant_kernels(name: str):
    """The tree-attention choices of a variant, for its captures (replays keep them)."""
    use_fused_tree_merge("fm1" in name)
    ta.tree_attention_launch = _direct_launch if "direct" in name else _LAUNCH
    try:
        yield
    finally:
        use_fused_tree_merge(False)
        ta.tree_attention_launch = _LAUNCH


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--variants", nargs="+", default=["fm0_fold0", "fm1_fold0", "fm0_fold1", "fm1_fold1"])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = b7.TINY if args.tiny else b7.LLAMA2_7B
    torch.manual_seed(0)
    model = b7.build_target(shape, device, dtype)
    torch.manual_seed(1)
    V = shape["vocab_size"]
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:min(8192, V)].sort().values
    head = Eagle1Head.from_target(model, draft_vocab=kept)
    if device == "cuda":
        quantize_fp8_(head.eval().requires_grad_(False))
    layers = head.feature_layers
    depth = b7.TREE["depth"]
    steps_per_round = 2 + args.reps + 1 + 8 * max(1, args.reps // 2)
    capacity = capacity_for(args.context, steps_per_round * (depth + 1), 128)
    out = {"meta": dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", context=args.context,
                        rounds=args.rounds, reps=args.reps, tree=b7.TREE, torch=torch.__version__,
                        transformers=__import__("transformers").__version__), "batches": {}}
    for batch in args.batches:
        ids = torch.randint(0, V, (batch, args.context), device=device,
                            generator=torch.Generator(device=device).manual_seed(batch))
        made = {"plain": (StaticAdapter(model, capacity=capacity), None, 0)}
        for v in args.variants:
            drafter = cuda_graphed(EagleDrafter(head, DynamicTree(**b7.TREE), fold="fold1" in v))
            made[v] = (StaticAdapter(model, layers, capacity=capacity), drafter, depth)
        times = {name: {"q1": [], "q8": []} for name in made}
        names = list(made)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                adapter, drafter, k = made[name]
                with variant_kernels(name):  # read at capture (the first round); replays keep their capture's
                    fn = b7.specdec_step(adapter, ids, drafter, k, sync=False)
                    times[name]["q1"].append(b7.time_ms(fn, warmup=2, reps=args.reps, device=device))
                    times[name]["q8"].append(b7.time_ms(fn, warmup=1, reps=max(1, args.reps // 2), device=device,
                                                        queued=8))
            print(f"batch {batch} round {r}: " + ", ".join(f"{n} {times[n]['q1'][-1]:.3f}/{times[n]['q8'][-1]:.3f}"
                                                         for n in names), flush=True)
        res = {}
        for name in names:
            row = {}
            for q in ("q1", "q8"):
                row[q] = round(statistics.median(times[name][q]), 4)
                ratios = [a / b for a, b in zip(times[name][q], times["plain"][q])]
                row[q + "_vs_plain"] = round(statistics.median(ratios), 4)
            counts = getattr(made[name][1], "counts", None)  # the graphed drafter's (none for the plain step)
            row["counts"] = None if counts is None else dict(counts)
            res[name] = row
        out["batches"][batch] = {"summary": res, "times": times}
        print(f"\n| batch {batch} | idle device ms | vs plain | 8 queued ms | vs plain |\n|---|---:|---:|---:|---:|")
        for name in names:
            s = res[name]
            print(f"| {name} | {s['q1']:.3f} | {s['q1_vs_plain']:.3f} | {s['q8']:.3f} | {s['q8_vs_plain']:.3f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
