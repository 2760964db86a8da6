"""The fast path beside gpt-fast end to end, in alternating rounds, with a GPU-kernel profile of each (H200).

Every method is warmed on every prompt first (compiling, capturing), then the methods are timed in ``--rounds``
rounds that alternate between them (whole ``generate`` calls, prefill included, as the anchor harness times
gpt-fast), so a slow stretch of the host hits every method alike; the median round is the figure. Methods:
specdec plain and EAGLE-3 (``--eagle3``) on ``fast="compile"`` (or ``--mode graphs``), and gpt-fast vanilla
(``--gptfast``, compiled as the anchor compiles it; last, because importing it sets inductor options
process-wide). With ``--profile``: kernels and GPU-busy time per token of the captured plain forward (30 back-to-back
replays) and per EAGLE-3 step (two prompts), and per token of a gpt-fast ``generate``, with the top kernels.
Also the split of each specdec call into prefill and decode (``GenerationStats``).

Example (H200)::

    python examples/bench_fast_rounds.py --target pycoder-18m --data pycode-heldout.jsonl --eagle3 heads/e3 \\
        --gptfast anchors --num-prompts 6 --rounds 3 --profile --out runs/rounds

Writes ``rounds.json`` and ``rounds.png`` (median and rounds per method) to ``--out`` and prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_fast  # noqa: E402

import specdec as sd  # noqa: E402
from specdec.static import _STORES  # noqa: E402


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Total length (us) of the union of ``(start, end)`` intervals (GPU busy time: overlapping kernels count once).

    >>> busy_us([(0, 2), (1, 3), (5, 6)])
    4.0
    """
    total, current = 0.0, None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        total += current[1] - current[0]
    return float(total)


def kernel_summary(events: list[tuple[str, float, float]], per: int, top: int = 12) -> dict:
    """Kernels per unit, GPU-busy us per unit and the top kernels by time, from ``(name, start_us, end_us)``.

    >>> kernel_summary([("a", 0, 2), ("b", 1, 3), ("a", 5, 6)], per=1)["top"][0]
    ('a', 2.0, 3.0)
    """
    by_name: dict[str, tuple[int, float]] = {}
    for name, start, end in events:
        count, spent = by_name.get(name[:70], (0, 0.0))
        by_name[name[:70]] = (count + 1, spent + end - start)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"kernels_per": round(len(events) / per, 1),
            "gpu_busy_us_per": round(busy_us([(s, e) for _, s, e in events]) / per, 1),
            "top": [(name, round(c / per, 2), round(t / per, 1)) for name, (c, t) in ranked]}


def profile_kernels(fn, per) -> dict:
    """:func:`kernel_summary` of the CUDA kernels ``fn()`` runs, over ``per`` units of work (an int, or a callable
    read after ``fn`` ran)."""
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
              if e.device_type == DeviceType.CUDA]
    return kernel_summary(events, per() if callable(per) else per)


def timed_round(run, prompts) -> dict:
    """One pass over ``prompts``: tokens/s of whole calls and, for specdec runs, the prefill / decode split."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens = steps = 0
    prefill = wall = 0.0
    for ids in prompts:
        out = run(ids)
        tokens += sum(len(t) for t in out.tokens)
        stats = getattr(run, "last_stats", None)
        if stats is not None:
            prefill, wall, steps = prefill + stats.prefill_time, wall + stats.wall_time, steps + stats.num_steps
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    row = {"tokens_per_s": tokens / elapsed, "ms_per_prompt": 1e3 * elapsed / len(prompts)}
    if steps:
        row.update(prefill_ms=1e3 * prefill / len(prompts), decode_ms_per_step=1e3 * (wall - prefill) / steps,
                   tau=tokens / steps)
    return row


def profile_method(name: str, run, target, prompts, args) -> tuple[str, dict]:
    """``(label, kernel summary)`` of one warmed method: the plain forward's replays, EAGLE-3 steps, or a gpt-fast
    ``generate`` per token."""
    if name.startswith("specdec plain"):
        store = next(st for k, st in _STORES[target].items() if k[0] == () and k[2] == args.mode)
        runner = store.buffers.plain.runner
        return "plain replay (per token)", profile_kernels(lambda: [runner._run() for _ in range(30)], 30)
    if name.startswith("specdec EAGLE-3"):
        steps: list[int] = []
        return "EAGLE-3 (per step)", profile_kernels(
            lambda: [steps.append(run(ids).steps) for ids in prompts[:2]], lambda: max(1, sum(steps)))
    return "gpt-fast (per token)", profile_kernels(lambda: run(prompts[0]), args.max_new_tokens)


def plot_rounds(panels: dict[str, dict[str, list[float]]], path: str, title: str = "") -> None:
    """One panel per run: per method, a bar at the median tokens/s and a dot per round (gpt-fast in red).

    Args:
        panels: run label -> method -> tokens/s of each round.
        path: the PNG to write.
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.2), squeeze=False, sharex=True)
    for ax, (label, methods) in zip(axes[0], panels.items()):
        names = list(methods)
        for i, name in enumerate(names):
            values = methods[name]
            color = "#C44E52" if name.startswith("gpt-fast") else "#4C72B0"
            ax.barh(i, statistics.median(values), color=color, alpha=0.6)
            ax.plot(values, [i] * len(values), "o", color="black", markersize=3)
            ax.text(statistics.median(values), i, f" {statistics.median(values):.0f}", va="center", fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s (whole generate calls)")
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def warm(name: str, run, prompts, report: dict, target, args) -> None:
    """Run ``run`` once on every prompt (compiling, capturing), then profile it when ``--profile``."""
    t0 = time.perf_counter()
    for ids in prompts:
        run(ids)
    report["first_pass_s"][name] = round(time.perf_counter() - t0, 1)
    print(f"warmed {name} in {report['first_pass_s'][name]} s", flush=True)
    if args.profile:
        label, profile = profile_method(name, run, target, prompts, args)
        report["profiles"][label] = profile


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_fast.add_fixture_args(ap, num_prompts=6)
    ap.add_argument("--mode", default="compile", choices=["graphs", "compile"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-plain", action="store_true", help="leave specdec's plain decoding out (saves its compile)")
    ap.add_argument("--profile", action="store_true", help="kernel profiles (plain replay, EAGLE-3 step, gpt-fast)")
    ap.add_argument("--out", default="runs/rounds")
    bench_fast.add_kernel_args(ap)
    args = ap.parse_args(argv)
    with bench_fast.kernels_for(args):
        return run_rounds(args)


def run_rounds(args) -> dict:
    """The rounds (see the module's docstring) for parsed ``args``."""
    if not torch.cuda.is_available():
        raise SystemExit("bench_fast_rounds.py times the CUDA fast path: run it on a GPU machine")
    import transformers

    torch.backends.cuda.enable_cudnn_sdp(False)  # the anchor's setting for eager code; captured steps opt back in
    os.makedirs(args.out, exist_ok=True)
    dtype, n, fast = torch.bfloat16, args.max_new_tokens, (True if args.mode == "graphs" else "compile")
    target = transformers.AutoModelForCausalLM.from_pretrained(
        args.target, dtype=dtype, attn_implementation="sdpa").cuda().eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.target)
    prompts = bench_fast.load_prompts(args.data, tokenizer, args.num_prompts, args.prompt_tokens, "cuda")
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "prompts": len(prompts), "mode": args.mode,
                    "decode_kernels": args.decode_kernels or "defaults",
                    "tree_attention": args.tree_attention or "default",
                    "first_pass_s": {}, "profiles": {}}
    runs = {} if args.no_plain else {f"specdec plain ({args.mode})": bench_fast.specdec_run(target, None, n, fast=fast)}
    if args.eagle3:
        head = sd.formats.load_eagle_head(args.eagle3, target, dtype=dtype, device="cuda")
        runs[f"specdec EAGLE-3 ({args.mode})"] = bench_fast.specdec_run(target, sd.recipes.eagle3(head), n, fast=fast)
    for name, run in runs.items():  # warm-up: every prompt once (compiles, captures)
        warm(name, run, prompts, report, target, args)
    if args.gptfast:  # last: importing gpt-fast sets inductor options process-wide
        runs["gpt-fast vanilla"] = bench_fast.gptfast_methods(args.gptfast, target, None, [], n, "cuda",
                                                              dtype)["gpt-fast vanilla"]
        warm("gpt-fast vanilla", runs["gpt-fast vanilla"], prompts, report, target, args)
    rounds: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            rounds[name].append(timed_round(run, prompts))
    report["rounds"] = rounds
    report["median_tokens_per_s"] = {name: statistics.median(r["tokens_per_s"] for r in rows)
                                     for name, rows in rounds.items()}
    med = report["median_tokens_per_s"]
    if "gpt-fast vanilla" in med:
        base = med["gpt-fast vanilla"]
        report["vs_gptfast"] = {name: {"tokens_per_s_ratio": v / base, "time_ratio": base / v}
                                for name, v in med.items() if name != "gpt-fast vanilla"}
    with open(os.path.join(args.out, "rounds.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_rounds({f"{report['device']}, {len(prompts)} prompts": {
        name: [r["tokens_per_s"] for r in rows] for name, rows in rounds.items()}},
        os.path.join(args.out, "rounds.png"), "the fast path beside gpt-fast, alternating rounds")
    print(f"\n{'method':<32} {'rounds (tokens/s)':<28} {'median':>8} {'x gpt-fast':>10}")
    for name, rows in rounds.items():
        ratio = report.get("vs_gptfast", {}).get(name, {}).get("tokens_per_s_ratio", float("nan"))
        listed = ", ".join(f"{r['tokens_per_s']:.0f}" for r in rows)
        print(f"{name:<32} {listed:<28} {med[name]:>8.1f} {ratio:>10.2f}")
    return report


if __name__ == "__main__":
    main()
