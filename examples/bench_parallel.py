"""Parallel drafting against sequential drafting, in one process: P-EAGLE, DFlash and DSpark against EAGLE-2 and
EAGLE-3 at K = 3, 5, 7, with HF vanilla and HF assisted generation as the baseline.

Per method and K (greedy, batch 1, every specdec row verified losslessly):

- tokens/s and speedup against HF vanilla ``generate`` (timed loop, methods interleaved per prompt);
- tau (emitted tokens per target forward) and acceptance per depth;
- draft time per step (ms): ``generate(profile=True)`` on the first prompts, the ``draft`` phase divided by steps
  (profiling synchronises after each phase, so it runs apart from the timed loop).

Example (GPU; heads from examples/train_eagle.py, train_peagle.py and train_dflash.py)::

    python examples/bench_parallel.py --target ../shared/models/pycoder-18m \\
        --draft ../shared/models/pycoder-draft-4m --data ../shared/data/pycode-heldout.jsonl \\
        --eagle2 runs/eagle/eagle1/final --eagle3 runs/eagle/eagle3/final --peagle runs/peagle/peagle/final \\
        --dflash runs/dflash/dflash/final --dspark runs/dspark/dspark/final --out runs/parallel

``--fast graphs`` / ``--fast compile`` run every specdec row with ``generate(fast=True)`` / ``fast="compile"``
(static KV cache, captured and compiled target forwards): where the target forward is cheap, draft time matters
more, which is the parallel drafters' case.

Writes ``results.json``, ``results.md`` and ``results.png`` (speedup against K, draft time against K, acceptance
per depth at the largest K) to ``--out``. ``--quick`` runs tiny random models on a CPU (the smoke test).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import specdec as sd  # noqa: E402
from specdec import bench  # noqa: E402


def _load_heads(args, target, dtype, device) -> dict:
    """Method name -> (head, factory(head, K) -> drafter)."""
    from specdec.formats import load_dflash_head, load_eagle_head, load_peagle_head

    heads = {}
    if args.eagle2:
        heads["EAGLE-2"] = (load_eagle_head(args.eagle2, target, dtype=dtype, device=device),
                            lambda h, k: sd.recipes.eagle2(h, depth=k, total_tokens=args.total_tokens))
    if args.eagle3:
        heads["EAGLE-3"] = (load_eagle_head(args.eagle3, target, dtype=dtype, device=device),
                            lambda h, k: sd.recipes.eagle3(h, depth=k, total_tokens=args.total_tokens))
    if args.peagle:
        heads["P-EAGLE"] = (load_peagle_head(args.peagle, target, dtype=dtype, device=device),
                            lambda h, k: sd.recipes.peagle(h, num_drafts=k))
    if args.dflash:
        heads["DFlash"] = (load_dflash_head(args.dflash, target, dtype=dtype, device=device),
                           lambda h, k: sd.recipes.dflash(h))
    if args.dspark:
        heads["DSpark"] = (load_dflash_head(args.dspark, target, dtype=dtype, device=device),
                           lambda h, k: sd.recipes.dspark(h))
    return heads


def _quick_inputs(folder: Path) -> dict:
    """Tiny target, draft and random heads of every kind, written in their real formats (seconds on a CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.formats import save_dflash_head, save_eagle_head, save_peagle_head
    from specdec.heads import DFlashHead, DSparkHead, Eagle1Head, Eagle3Head, PEagleHead

    torch.manual_seed(0)  # weights of the throw-away models only; nothing measured depends on the global RNG

    def llama(hidden, layers):
        return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden,
                                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                            max_position_embeddings=512, attn_implementation="sdpa")).eval()

    target, draft = llama(64, 4), llama(32, 1)
    folder.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    save_eagle_head(Eagle1Head.from_target(target), folder / "e1")
    save_eagle_head(Eagle3Head.from_target(target), folder / "e3")
    save_peagle_head(PEagleHead.from_target(target, num_layers=1, max_drafts=7), folder / "peagle")
    save_dflash_head(DFlashHead.from_target(target, block_size=8), folder / "dflash")
    save_dflash_head(DSparkHead.from_target(target, block_size=8), folder / "dspark")
    prompts = folder / "prompts.jsonl"
    gen = torch.Generator().manual_seed(0)
    with open(prompts, "w") as f:
        for _ in range(5):  # 3 evaluated, 2 for --tree optimal's calibration
            f.write(json.dumps({"prompt_ids": torch.randint(3, 96, (24,), generator=gen).tolist()}) + "\n")
    return {"target": folder / "target", "draft": folder / "draft", "eagle2": folder / "e1", "eagle3": folder / "e3",
            "peagle": folder / "peagle", "dflash": folder / "dflash", "dspark": folder / "dspark",
            "data": prompts}


def _prompts(args, target_path, device, skip: int = 0, count: int | None = None) -> list[torch.Tensor]:
    """Rows ``skip .. skip + count`` of ``--data`` (default: the first ``--num-prompts``), each ``[1, T]``."""
    rows = [json.loads(line) for line in open(args.data) if line.strip()][skip: skip + (count or args.num_prompts)]
    if rows and "prompt_ids" in rows[0]:
        return [torch.tensor(r["prompt_ids"][-args.prompt_tokens:], device=device)[None] for r in rows]
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(target_path)
    ids = [tok(r["prompt"], return_tensors="pt").input_ids[:, -args.prompt_tokens:] for r in rows]
    return [p.to(device) for p in ids]


TREE_RECIPES = {"P-EAGLE": lambda h, t: sd.recipes.peagle(h, tree=t),
                "DFlash": lambda h, t: sd.recipes.dflash(h, tree=t),
                "DSpark": lambda h, t: sd.recipes.dspark(h, tree=t)}


def _trees_per_k(args, target, method: str, head, calibration: list) -> dict:
    """Row suffix -> K -> tree choices of the ``<method>+tree`` rows: ``--tree`` pruned to depth K (suffix
    ``+tree``), or Medusa's optimal tree of depth <= K from the head's acceptance per depth and rank on the
    calibration prompts (level-wise drafts ignore their parent, so ``mode="continuation"`` is exact for them), one
    per ``--tree-nodes`` budget (suffix ``+tree``, or ``+tree<nodes>`` when several budgets are swept)."""
    from specdec.trees.optimize import measure_rank_acceptance, optimal_tree

    if args.tree != "optimal":  # a preset name (the recipes' resolution and errors), pruned to depth K
        choices = sd.recipes.medusa_tree(args.tree, head.num_levels).tree.choices
        return {"+tree": {k: tuple(p for p in choices if len(p) <= min(k, head.num_levels)) for k in args.ks}}
    if not calibration:
        raise SystemExit("--tree optimal needs calibration prompts: --data must hold rows past --num-prompts")
    levels = min(max(args.ks), head.num_levels)
    acc = measure_rank_acceptance(target, lambda t: TREE_RECIPES[method](head, t), calibration, num_levels=levels,
                                  num_ranks=8, max_new_tokens=args.max_new_tokens, eos_token_id=[],
                                  mode="continuation", progress=False)
    budgets = args.tree_nodes or [args.total_tokens]
    print(f"{method}: acceptance per depth of ranks 1-3 (calibration, {len(calibration)} prompts): "
          + "; ".join(" ".join(f"{a:.2f}" for a in row[:3]) for row in acc.probs.tolist()))
    return {("+tree" if len(budgets) == 1 else f"+tree{nodes}"): {k: optimal_tree(acc, nodes, max_depth=k)
                                                                   for k in args.ks} for nodes in budgets}


def _draft_ms(target, drafter, prompts, n, k, repeats: int, fast=False) -> tuple[dict, dict]:
    """Profiled runs: ms per step of each phase (``draft``, ``target``, ``verify``, ``commit``, ``update``), and
    what a graphed drafter did during them (``GraphedDrafter.counts``: captures there would inflate the phases)."""
    for ids in prompts[:repeats]:  # warm: every graph these prompts need is captured before the profiled calls
        sd.generate(target, ids, drafter=drafter, num_drafts=k, max_new_tokens=n, fast=fast)
    counts = dict(getattr(drafter, "counts", {}))  # a GraphedDrafter's: did the profiled calls capture anything?
    totals, steps = {}, 0
    for ids in prompts[:repeats]:
        out = sd.generate(target, ids, drafter=drafter, num_drafts=k, max_new_tokens=n, profile=True, fast=fast)
        steps += out.stats.num_steps
        for phase, seconds in out.stats.phase_times.items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    during = {name: value - counts[name] for name, value in getattr(drafter, "counts", {}).items()}
    return {phase: 1e3 * s / max(1, steps) for phase, s in totals.items()}, during


def _target_graphs(target) -> tuple[int, int]:
    """``(graphs held, distinct buffers)`` over the fast path's held stores of ``target`` (see
    :func:`specdec.static.target_adapter`; CUDA only: nothing is held elsewhere)."""
    from specdec.static import _STORES

    stores = [store for store in _STORES.get(target, {}).values() if store.buffers is not None]
    return sum(len(store.buffers.runners) for store in stores), len({id(store.buffers) for store in stores})


def _counted(run, drafter, target, calls: list):
    """``run`` (a benchmark method), appending per call what it captured: the drafter's new graphs and buffer
    changes (a :class:`~specdec.graphs.GraphedDrafter`'s counts), and the target store's new graphs and buffers.
    A call of the timed loop that captures (after the warm-up prompts) pays the capture in its time."""
    def counted(ids):
        before, held = dict(getattr(drafter, "counts", {})), _target_graphs(target)
        out = run(ids)
        after, now = getattr(drafter, "counts", {}), _target_graphs(target)
        calls.append({"drafter_captures": after.get("captures", 0) - before.get("captures", 0),
                      "drafter_buffer_changes": after.get("buffer_changes", 0) - before.get("buffer_changes", 0),
                      "target_graphs_added": now[0] - held[0], "target_buffers": now[1]})
        return out
    return counted


def _plot(rows: list, ks: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        style = "--" if method.startswith("EAGLE") else "-"
        axes[0].plot([r["K"] for r in mine], [r["speedup"] for r in mine], style, marker="o", label=method)
        axes[1].plot([r["K"] for r in mine], [r["draft_ms"] for r in mine], style, marker="o", label=method)
        last = mine[-1]
        axes[2].plot(range(1, len(last["acceptance_per_depth"]) + 1), last["acceptance_per_depth"], style,
                     marker="o", label=f"{method} (K={last['K']})")
    axes[0].set(xlabel="K (draft depth)", ylabel="speedup over HF vanilla", title="speedup")
    axes[1].set(xlabel="K (draft depth)", ylabel="ms per step", title="draft time per step")
    axes[2].set(xlabel="depth", ylabel="acceptance rate", title="acceptance per depth", ylim=(0, 1.05))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_xticks(ks) if ax is not axes[2] else None
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft", help="draft model for HF assisted generation")
    ap.add_argument("--data", help="JSONL with a 'prompt' field (held-out prompts)")
    for name in ("eagle2", "eagle3", "peagle", "dflash", "dspark"):
        ap.add_argument(f"--{name}", help=f"{name} head folder")
    ap.add_argument("--ks", type=int, nargs="+", default=[3, 5, 7])
    ap.add_argument("--total-tokens", type=int, default=60, help="EAGLE-2/3 dynamic tree size")
    ap.add_argument("--tree", default=None,
                    help="also run every parallel drafter with a level-wise tree per K: a Medusa preset name such as "
                         "mc_sim_7b_63 (pruned to depth K), or 'optimal' (Medusa's greedy tree of --tree-nodes nodes "
                         "and depth <= K from each head's per-depth, per-rank acceptance measured on calibration "
                         "prompts that are not evaluated): rows '<method>+tree'")
    ap.add_argument("--tree-nodes", type=int, nargs="+", default=None,
                    help="node budget(s) of 'optimal' trees (default: --total-tokens, the EAGLE trees' size); several "
                         "budgets give rows '<method>+tree<nodes>' each (a tree-size sweep in one run)")
    ap.add_argument("--calibration-prompts", type=int, default=8,
                    help="prompts of the 'optimal' trees' calibration, read after the evaluated ones in --data")
    ap.add_argument("--num-prompts", type=int, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--profile-prompts", type=int, default=3, help="prompts of the profiled (draft time) runs")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=None, help="time budget of the timed loop")
    ap.add_argument("--no-cudnn-sdpa", action="store_true", help="disable cuDNN SDPA process-wide (every method)")
    ap.add_argument("--fast", choices=["off", "graphs", "compile"], default="off",
                    help="the target on the fast path: generate(fast=True) or fast='compile' (every specdec row)")
    ap.add_argument("--only", nargs="+", default=None, metavar="ROW",
                    help="run only these specdec rows, e.g. 'EAGLE-3 K=7' 'DFlash+tree K=7' (baselines always run)")
    ap.add_argument("--out", default="runs/parallel")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test on tiny random models (seconds)")
    args = ap.parse_args(argv)
    if args.quick:
        quick = _quick_inputs(Path(args.out) / "quick_inputs")
        for key, value in quick.items():
            setattr(args, key, str(value))
        args.dtype, args.device, args.warmup = "float32", "cpu", 0
        args.max_new_tokens, args.profile_prompts = min(args.max_new_tokens, 12), 1
        args.num_prompts, args.calibration_prompts = min(args.num_prompts, 3), 2
    if not (args.target and args.data):
        ap.error("--target and --data are required (or --quick)")
    if args.no_cudnn_sdpa:
        torch.backends.cuda.enable_cudnn_sdp(False)
    os.makedirs(args.out, exist_ok=True)
    import transformers

    dtype = getattr(torch, args.dtype)
    load = dict(dtype=dtype, attn_implementation="sdpa")
    target = transformers.AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
    draft = (transformers.AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device).eval()
             if args.draft else None)
    prompts = _prompts(args, args.target, args.device)
    calibration = (_prompts(args, args.target, args.device, skip=args.num_prompts, count=args.calibration_prompts)
                   if args.tree == "optimal" else [])
    heads = _load_heads(args, target, dtype, args.device)
    n = args.max_new_tokens
    fast = {"off": False, "graphs": True, "compile": "compile"}[args.fast]
    methods = {"HF vanilla": bench.hf_method(target, n)}
    if draft is not None:
        methods["HF assisted"] = bench.hf_method(target, n, assistant_model=draft)
    drafters, trees = {}, {}  # trees: row name ("P-EAGLE+tree", "P-EAGLE+tree120") -> K -> tree choices
    calls: dict = {}  # (method, K) -> per call of the benchmark loop: what it captured (see _counted)
    if args.tree:
        for method, (head, _make) in list(heads.items()):
            if method in TREE_RECIPES:
                for suffix, per_k in _trees_per_k(args, target, method, head, calibration).items():
                    trees[method + suffix] = per_k
                    heads[method + suffix] = (head, lambda h, k, m=method, t=per_k: TREE_RECIPES[m](h, t[k]))
    for method, (head, make) in heads.items():
        for k in args.ks:
            if args.only and f"{method} K={k}" not in args.only:
                continue
            drafter = make(head, k)
            depth = max(map(len, trees[method][k])) if method in trees else k
            drafters[(method, k)] = drafter, depth
            sized = {"max_cache_len": args.prompt_tokens + n} if fast else {}  # one cache size: no re-capture
            calls[(method, k)] = []
            methods[f"{method} K={k}"] = _counted(bench.specdec_method(target, lambda d=drafter: d, n,
                                                                        num_drafts=depth, fast=fast, **sized),
                                                   drafter, target, calls[(method, k)])
    with open(os.path.join(args.out, "log.txt"), "w") as log:
        results = bench.run_benchmark(methods, prompts, warmup=args.warmup, baseline="HF vanilla",
                                      max_seconds=args.max_seconds, log=log)
    by_name = {r.name: r for r in results}
    rows = []
    for (method, k), (drafter, depth) in drafters.items():
        r = by_name[f"{method} K={k}"]
        phases, graph_counts = _draft_ms(target, drafter, prompts, n, depth, args.profile_prompts, fast)
        rows.append({"method": method, "K": k, "tokens_per_second": r.tokens_per_second, "speedup": r.speedup,
                     "tau": r.tau, "acceptance_per_depth": r.acceptance_per_depth, "greedy_match": r.greedy_match,
                     "draft_ms": phases.get("draft", float("nan")), "phases_ms_per_step": phases,
                     "graph_counts_while_profiled": graph_counts,
                     "captures_per_call": calls[(method, k)],
                     "tree_nodes": len(trees[method][k]) if method in trees else None})
    measured = results[0].extra["prompts"]
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    title = (f"{os.path.basename(str(args.target).rstrip('/'))}, {args.dtype}, greedy, batch 1, {measured} prompts, "
             f"last {args.prompt_tokens} prompt tokens, {n} new tokens, {device_name}"
             + (f", generate(fast={fast!r})" if fast else ""))
    lines = [f"# Parallel drafting vs EAGLE-2/3 — {title}", "",
             "| method | K | tokens/s | speedup | tau | draft ms/step | same as HF vanilla | acceptance per depth |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r.name.startswith("HF"):
            lines.append(f"| {r.name} | - | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | - | - | "
                         f"{100 * r.greedy_match:.0f}% | - |")
    for row in rows:
        acc = ", ".join(f"{a:.2f}" for a in row["acceptance_per_depth"])
        lines.append(f"| {row['method']} | {row['K']} | {row['tokens_per_second']:.1f} | {row['speedup']:.2f}x | "
                     f"{row['tau']:.2f} | {row['draft_ms']:.2f} | {100 * row['greedy_match']:.0f}% | {acc} |")
    best_parallel = max((r for r in rows if not r["method"].startswith("EAGLE")),
                        key=lambda r: r["tokens_per_second"], default=None)
    best_e3 = max((r for r in rows if r["method"] == "EAGLE-3"), key=lambda r: r["tokens_per_second"], default=None)
    summary = {}
    if best_parallel and best_e3:
        summary = {"best_parallel": f"{best_parallel['method']} K={best_parallel['K']}",
                   "best_eagle3": f"EAGLE-3 K={best_e3['K']}",
                   "ratio_tokens_per_second": best_parallel["tokens_per_second"] / best_e3["tokens_per_second"]}
        lines += ["", f"Best parallel drafter: {summary['best_parallel']}, "
                      f"{summary['ratio_tokens_per_second']:.2f}x the tokens/s of the best {summary['best_eagle3']}."]
    late = []  # rows that captured inside the timed loop (after the warm-up calls): their time includes it
    for row in rows:
        timed = row["captures_per_call"][args.warmup:]
        drafter = sum(c["drafter_captures"] + c["drafter_buffer_changes"] for c in timed)
        target_added = sum(c["target_graphs_added"] for c in timed)
        if drafter or target_added:
            late.append(f"{row['method']} K={row['K']}: drafter {drafter}, target {target_added} "
                        f"(over {len(timed)} timed calls)")
    lines += ["", "Captures inside the timed loop: " + ("; ".join(late) if late else "none") + "."]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"title": title, "rows": rows, "summary": summary, "torch": torch.__version__,
                   "transformers": transformers.__version__,
                   "baselines": [{"name": r.name, "tokens_per_second": r.tokens_per_second, "speedup": r.speedup}
                                 for r in results if r.name.startswith("HF")]}, f, indent=1)
    try:
        _plot(rows, args.ks, os.path.join(args.out, "results.png"), title)
    except ImportError as e:  # matplotlib is optional (the `plot` extra)
        print(f"no plot: {e}")
    print(md)


if __name__ == "__main__":
    main()
