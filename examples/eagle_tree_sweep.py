"""Sweep EAGLE-2 dynamic-tree parameters (depth x node budget) for one trained head: tau, acceptance, tokens/s.

The EAGLE-2 paper fixes ``total_tokens`` / ``depth`` / ``top_k`` per model size. This script measures how the
mean accepted length (tau) and the speed move with them on your target and prompts. It writes ``sweep.json``,
``sweep.md`` and ``sweep.png`` (tau and tokens/s against ``total_tokens``, one line per depth).

Example (CPU, float32; the fixture target and a head from examples/train_eagle.py)::

    python examples/eagle_tree_sweep.py --target PATH/TO/pycoder-18m --head runs/eagle/eagle1/final \
        --data PATH/TO/pycode-heldout.jsonl --num-prompts 8 --depths 4 6 8 --totals 16 32 60 96

Greedy decoding; every output is checked against plain greedy decoding (``same output``), which holds exactly in
float32.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specdec as sd  # noqa: E402
from specdec import bench, drafters, formats, trees  # noqa: E402


def sweep(target, head, prompts, depths, totals, top_k: int, max_new_tokens: int, progress: bool = True) -> list:
    """Run every (depth, total_tokens) pair on every prompt.

    Args:
        target: the HF causal LM.
        head: a loaded EAGLE head (``formats.load_eagle_head``).
        prompts: ``[1, T]`` prompt tensors on the target's device.
        depths, totals: the grid (``DynamicTree.depth`` and ``DynamicTree.total_tokens``).
        top_k: ``DynamicTree.top_k`` (capped at each pair's ``total_tokens - 1``).
        max_new_tokens: tokens generated per prompt.
        progress: show a tqdm bar.

    Returns:
        One dict per pair: depth, total_tokens, tau, tokens_per_second, acceptance_per_depth, same_output.
    """
    from tqdm.auto import tqdm

    plain = [sd.generate(target, p, max_new_tokens=max_new_tokens).sequences for p in prompts]
    rows = []
    for depth, total in tqdm([(d, t) for d in depths for t in totals], desc="sweep", disable=not progress):
        tree = trees.DynamicTree(total, depth, min(top_k, total - 1))
        drafter = sd.graphs.cuda_graphed(drafters.EagleDrafter(head, tree))
        sd.generate(target, prompts[0], drafter=drafter, max_new_tokens=8)  # warm-up (and graph capture on CUDA)
        emitted = steps = new = 0
        tries = torch.zeros(depth, dtype=torch.long)
        hits = torch.zeros(depth, dtype=torch.long)
        same = 0
        seconds = 0.0
        for p, ref in zip(prompts, plain):
            bench._sync()
            t0 = time.perf_counter()
            out = sd.generate(target, p, drafter=drafter, max_new_tokens=max_new_tokens)
            bench._sync()
            seconds += time.perf_counter() - t0
            s = out.stats
            emitted += s.tau * s.num_steps
            steps += s.num_steps
            new += s.num_new_tokens
            tries[: len(s.depth_tries)] += torch.tensor(s.depth_tries, dtype=torch.long)
            hits[: len(s.depth_hits)] += torch.tensor(s.depth_hits, dtype=torch.long)
            same += int(torch.equal(out.sequences, ref))
        rows.append({"depth": depth, "total_tokens": total, "top_k": min(top_k, total - 1),
                     "tau": emitted / max(steps, 1), "tokens_per_second": new / max(seconds, 1e-9),
                     "acceptance_per_depth": (hits / tries.clamp(min=1)).tolist(),
                     "same_output": same / len(prompts)})
    return rows


def to_markdown(rows: list, title: str) -> str:
    """A table: one row per (depth, total_tokens)."""
    lines = [f"### {title}", "", "| depth | total_tokens | top_k | tau | tokens/s | accept@1..D | same output |",
             "|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_depth"])
        lines.append(f"| {r['depth']} | {r['total_tokens']} | {r['top_k']} | {r['tau']:.2f} | "
                     f"{r['tokens_per_second']:.1f} | {acc} | {100 * r['same_output']:.0f}% |")
    return "\n".join(lines) + "\n"


def plot(rows: list, path: str, title: str) -> None:
    """tau and tokens/s against total_tokens, one line per depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for depth in sorted({r["depth"] for r in rows}):
        sel = [r for r in rows if r["depth"] == depth]
        x = [r["total_tokens"] for r in sel]
        axes[0].plot(x, [r["tau"] for r in sel], marker="o", label=f"depth {depth}")
        axes[1].plot(x, [r["tokens_per_second"] for r in sel], marker="o", label=f"depth {depth}")
    axes[0].set_ylabel("tau (tokens per target forward)")
    axes[1].set_ylabel("tokens/s")
    for ax in axes:
        ax.set_xlabel("total_tokens (tree nodes, root included)")
        ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True, help="folder (or hub id) of an EAGLE-1 or EAGLE-3 head")
    ap.add_argument("--data", required=True, help="jsonl with a 'prompt' field")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--totals", type=int, nargs="+", default=[16, 32, 60, 96])
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="runs/eagle_sweep")
    args = ap.parse_args(argv)
    if min(args.totals) < 2 or min(args.depths) < 1:
        ap.error("--totals must be >= 2 (root + one draft) and --depths >= 1")
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    tok = transformers.AutoTokenizer.from_pretrained(args.target)
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype,
                                                               attn_implementation="sdpa").to(args.device).eval()
    head = formats.load_eagle_head(args.head, target, dtype=dtype, device=args.device)
    prompts = [p.to(args.device) for p in bench.load_prompts(args.data, tok, args.num_prompts, args.prompt_tokens)]
    rows = sweep(target, head, prompts, args.depths, args.totals, args.top_k, args.max_new_tokens)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    title = (f"{os.path.basename(args.target.rstrip('/'))} + {type(head).__name__}, {str(dtype)[6:]}, greedy, "
             f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, {device_name}")
    md = to_markdown(rows, title)
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump({"title": title, "args": vars(args), "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(md)
    try:
        plot(rows, os.path.join(args.out, "sweep.png"), title)
    except ImportError as e:  # matplotlib is optional (the `plot` extra)
        print(f"no plot: {e}")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
