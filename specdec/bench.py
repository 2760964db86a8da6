"""Benchmark harness (Spec-Bench style): tokens/s, speedup, tau and acceptance per depth of decoding
methods measured in one process and one run, with HF ``generate`` peers.

Protocol (Spec-Bench's): warm-up first, synchronised wall clock per prompt, tokens/s = new tokens / time,
speedup against HF vanilla ``generate`` on the same model in the same run, tau = emitted tokens per target
forward. Results go to JSON, a Markdown table and plots.

References:
    Xia et al., "Unlocking Efficiency in LLM Inference: A Comprehensive Survey of Speculative Decoding"
    (Spec-Bench), arXiv 2401.07851.
"""
from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

__all__ = ["MethodResult", "RunOutput", "hf_method", "specdec_method", "run_benchmark", "to_markdown",
           "save_results", "plot_results", "load_prompts", "sweep_batch_and_k", "best_schedule", "plot_sweep",
           "left_pad", "no_gc", "triton_kernels_loaded"]


@contextlib.contextmanager
def no_gc(collect: bool = False):
    """Time a call without Python's cyclic garbage collector: off inside, restored after (``timeit`` does the same).

    A collection that starts inside a timed call (after a compiled baseline left millions of objects, a full pass
    can take most of a second) charges that call with work that is not its own; with the collector off it runs
    after the call instead, when the next allocation finds the threshold passed. The benchmark loops here and in
    ``examples/bench_fast.py`` time each call inside it.

    Args:
        collect: run a full collection first (outside the timing; it costs the wall clock a ``max_seconds`` budget
            counts).
    """
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def triton_kernels_loaded(prefix: str = "specdec.") -> int:
    """How many compiled Triton kernels the ``@triton.jit`` functions of the imported modules under ``prefix`` hold
    (each specialisation, compiled or read from triton's disk cache, is one; summed over devices).

    Taken before and after a timed call, a difference means the call paid a compile or a load (hundreds of
    milliseconds on a fresh machine) that a longer run would not pay again: a new constexpr combination, or an
    integer argument whose divisibility by 16 changed. 0 without triton.
    """
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover - depends on the environment
        return 0
    total, seen = 0, set()
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or module is None:
            continue
        for obj in list(vars(module).values()):
            fn = obj
            for _ in range(3):  # an autotuner or heuristics wrapper holds the JITFunction in .fn (a JITFunction's
                if isinstance(fn, JITFunction):  # own .fn is the Python function)
                    break
                fn = getattr(fn, "fn", None)
            if isinstance(fn, JITFunction) and id(fn) not in seen:
                seen.add(id(fn))
                total += sum(len(entry[0]) for entry in getattr(fn, "device_caches", {}).values())
    return total


@dataclass
class RunOutput:
    """One method on one prompt: new token ids and, for specdec methods, loop statistics."""

    new_tokens: list
    steps: int | None = None
    step_tokens: float = 0.0
    depth_tries: tuple = ()
    depth_hits: tuple = ()
    phase_times: dict | None = None


@dataclass
class MethodResult:
    """Aggregate of one method over all prompts."""

    name: str
    new_tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float | None = None
    tau: float | None = None
    acceptance_per_depth: list = field(default_factory=list)
    greedy_match: float | None = None
    extra: dict = field(default_factory=dict)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def load_prompts(path: str, tokenizer, num_prompts: int, prompt_tokens: int) -> list[torch.Tensor]:
    """Read ``prompt`` fields of a JSONL file and keep the last ``prompt_tokens`` tokens of each.

    Returns:
        A list of ``[1, T]`` int64 tensors.
    """
    out = []
    with open(path) as f:
        for line in f:
            if len(out) == num_prompts:
                break
            ids = tokenizer(json.loads(line)["prompt"], return_tensors="pt").input_ids[:, -prompt_tokens:]
            out.append(ids)
    return out


def hf_method(model, max_new_tokens: int, **generate_kwargs) -> Callable[[torch.Tensor], RunOutput]:
    """A peer: HF ``model.generate`` (greedy) with extra arguments (``assistant_model``,
    ``prompt_lookup_num_tokens``, ...)."""

    def run(ids: torch.Tensor) -> RunOutput:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, **generate_kwargs)
        return RunOutput(out[0, ids.shape[1]:].tolist())

    return run


def specdec_method(model, make_drafter: Callable | None, max_new_tokens: int, **generate_kwargs
                   ) -> Callable[[torch.Tensor], RunOutput]:
    """A specdec recipe: ``specdec.generate`` with a fresh drafter from ``make_drafter()`` (or none)."""
    from .generate import generate

    drafter = make_drafter() if make_drafter is not None else None

    def run(ids: torch.Tensor) -> RunOutput:
        out = generate(model, ids, drafter=drafter, max_new_tokens=max_new_tokens, **generate_kwargs)
        s = out.stats
        return RunOutput(out.sequences[0, ids.shape[1]: ids.shape[1] + int(out.num_new_tokens[0])].tolist(),
                         s.num_steps, s.tau * s.num_steps, s.depth_tries, s.depth_hits, s.phase_times)

    return run


def run_benchmark(methods: dict[str, Callable[[torch.Tensor], RunOutput]], prompts: Sequence[torch.Tensor], *,
                  warmup: int = 2, baseline: str | None = None, reference: str | None = None,
                  progress: bool = True, max_seconds: float | None = None, log=None) -> list[MethodResult]:
    """Time every method on every prompt (methods interleaved per prompt, so drifts hit all alike).

    Args:
        methods: name -> runner (see :func:`hf_method`, :func:`specdec_method`).
        prompts: ``[1, T]`` prompt tensors on the model's device.
        warmup: prompts run untimed first by every method.
        baseline: the method speedups are relative to (default: the first).
        reference: the method whose outputs define the greedy match rate (default: ``baseline``).
        max_seconds: stop after the prompt at which the measured time passes this budget (the results say
            how many prompts were measured, in ``extra["prompts"]``).
        log: a writable file that gets one line per prompt and method (flushed), for long runs.

    Returns:
        One :class:`MethodResult` per method, in the order given.
    """
    from tqdm.auto import tqdm

    names = list(methods)
    baseline = baseline or names[0]
    reference = reference or baseline
    for ids in prompts[:warmup]:
        for name in names:
            methods[name](ids)
    outputs = {n: [] for n in names}
    seconds = {n: 0.0 for n in names}
    start = time.perf_counter()
    for i, ids in enumerate(tqdm(prompts, desc="benchmark", disable=not progress)):
        for name in names:
            with no_gc():
                _sync()
                t0 = time.perf_counter()
                out = methods[name](ids)
                _sync()
                dt = time.perf_counter() - t0
            seconds[name] += dt
            outputs[name].append(out)
            if log is not None:
                log.write(f"prompt {i} {name}: {len(out.new_tokens)} tokens in {dt:.3f} s\n")
                log.flush()
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
    results = []
    for name in names:
        outs = outputs[name]
        new = sum(len(o.new_tokens) for o in outs)
        res = MethodResult(name, new, seconds[name], new / seconds[name], extra={"prompts": len(outs)})
        steps = [o.steps for o in outs]
        if all(s is not None for s in steps) and sum(steps):
            res.tau = sum(o.step_tokens for o in outs) / sum(steps)
            depth = max((len(o.depth_tries) for o in outs), default=0)
            tries = [sum(o.depth_tries[d] for o in outs if len(o.depth_tries) > d) for d in range(depth)]
            hits = [sum(o.depth_hits[d] for o in outs if len(o.depth_hits) > d) for d in range(depth)]
            res.acceptance_per_depth = [h / t for h, t in zip(hits, tries) if t]
            res.extra["steps"] = sum(steps)
            phases = [o.phase_times for o in outs if o.phase_times]
            if phases:
                res.extra["ms_per_step"] = {k: 1e3 * sum(p[k] for p in phases) / sum(steps) for k in phases[0]}
        ref = outputs[reference]
        match = [o.new_tokens == r.new_tokens for o, r in zip(outs, ref)]
        res.greedy_match = sum(match) / len(match)
        results.append(res)
    base = next(r for r in results if r.name == baseline)
    for r in results:
        r.speedup = r.tokens_per_second / base.tokens_per_second
    return results


def to_markdown(results: Sequence[MethodResult], title: str = "") -> str:
    """A Markdown table of the results."""
    lines = [f"### {title}", ""] if title else []
    lines += ["| method | tokens/s | speedup | tau | accept@1..D | same output as reference |",
              "|---|---:|---:|---:|---|---:|"]
    for r in results:
        acc = " ".join(f"{a:.2f}" for a in r.acceptance_per_depth) or "-"
        tau = f"{r.tau:.2f}" if r.tau is not None else "-"
        lines.append(f"| {r.name} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | {tau} | {acc} | "
                     f"{100 * r.greedy_match:.0f}% |")
    return "\n".join(lines)


def save_results(results: Sequence[MethodResult], path: str, **meta) -> None:
    """Write results and run metadata as JSON."""
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [asdict(r) for r in results]}, f, indent=2)


def plot_results(results: Sequence[MethodResult], path: str, title: str = "") -> None:
    """Bar chart of speedups (with tau annotated) and acceptance-per-depth curves, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r.name for r in results]
    ax1.barh(names, [r.speedup for r in results], color="#4C72B0")
    for i, r in enumerate(results):
        label = f"{r.speedup:.2f}x" + (f"  tau {r.tau:.2f}" if r.tau is not None else "")
        ax1.text(r.speedup, i, " " + label, va="center", fontsize=8)
    ax1.axvline(1.0, color="grey", lw=0.8)
    ax1.set_xlabel("speedup vs baseline (tokens/s ratio)")
    ax1.invert_yaxis()
    for r in results:
        if r.acceptance_per_depth:
            ax2.plot(range(1, len(r.acceptance_per_depth) + 1), r.acceptance_per_depth, marker="o", label=r.name)
    ax2.set_xlabel("draft depth d")
    ax2.set_ylabel("P(depth-d draft accepted | drafted)")
    ax2.set_ylim(0, 1.02)
    ax2.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def left_pad(rows: Sequence[torch.Tensor], pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D token tensors into a left-padded batch.

    Args:
        rows: ``B`` tensors of shape ``[T_i]``.
        pad_token_id: the padding token.

    Returns:
        ``(input_ids [B, max T_i], attention_mask [B, max T_i])``.
    """
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=rows[0].device)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - r.numel():] = r
        mask[i, width - r.numel():] = 1
    return ids, mask


def sweep_batch_and_k(target, make_drafter: Callable[[int], object], prompts: Sequence[torch.Tensor], *,
                      batch_sizes: Sequence[int], ks: Sequence[int], max_new_tokens: int, pad_token_id: int = 0,
                      repeats: int = 1, progress: bool = True) -> dict[int, dict[int, float]]:
    """Measure greedy tokens/s of ``specdec.generate`` for every batch size and every K (K = 0: no drafter).

    Each batch is made of the first ``batch_size`` prompts (cycled), left-padded to one length.

    Args:
        target: the target model.
        make_drafter: ``K -> drafter`` with ``max_num_drafts >= K``.
        prompts: ``[1, T_i]`` prompts on the target's device.
        batch_sizes: batch sizes to measure.
        ks: numbers of drafts to measure (include 0 for the plain baseline).
        max_new_tokens: new tokens per row (EOS is ignored so every row does the same work).
        pad_token_id: left-padding token.
        repeats: timed runs per cell (the fastest is kept); one untimed warm-up precedes them.

    Returns:
        ``{batch_size: {K: tokens per second}}``.
    """
    from tqdm.auto import tqdm

    from .generate import generate

    out: dict[int, dict[int, float]] = {}
    cells = [(b, k) for b in batch_sizes for k in ks]
    for b, k in tqdm(cells, desc="batch x K sweep", disable=not progress):
        ids, mask = left_pad([prompts[i % len(prompts)][0] for i in range(b)], pad_token_id)
        drafter = make_drafter(k) if k > 0 else None
        kwargs = dict(attention_mask=mask, drafter=drafter, max_new_tokens=max_new_tokens, eos_token_id=[])
        if k > 0:
            kwargs["num_drafts"] = k
        generate(target, ids, **{**kwargs, "max_new_tokens": min(8, max_new_tokens)})
        best = float("inf")
        for _ in range(repeats):
            _sync()
            t0 = time.perf_counter()
            res = generate(target, ids, **kwargs)
            _sync()
            best = min(best, time.perf_counter() - t0)
        out.setdefault(b, {})[k] = res.stats.num_new_tokens / best
    return out


def best_schedule(throughput: dict[int, dict[int, float]]) -> list[list[int]]:
    """The Dynamic SD schedule that picks, for each measured batch size, the K with the highest throughput.

    Consecutive measured batch sizes with the same best K are merged; a range ends just before the next measured
    size, and the last one is open-ended up to that size (past it the schedule's lookup keeps the last K).

    Args:
        throughput: ``{batch_size: {K: tokens per second}}`` as returned by :func:`sweep_batch_and_k`.

    Returns:
        ``[[start_bs, end_bs, K], ...]`` in the format of ``generate(schedule=...)`` (vLLM's
        ``num_speculative_tokens_per_batch_size``), starting at batch size 1.
    """
    sizes = sorted(throughput)
    if not sizes:
        raise ValueError("throughput is empty: measure at least one batch size")
    best = [max(throughput[b], key=lambda k: (throughput[b][k], -k)) for b in sizes]
    schedule: list[list[int]] = []
    for i, (b, k) in enumerate(zip(sizes, best)):
        start = 1 if i == 0 else b
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = end
        else:
            schedule.append([start, end, k])
    return schedule


def plot_sweep(throughput: dict[int, dict[int, float]], path: str, title: str = "") -> None:
    """Speedup over K = 0 against batch size, one curve per K (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(throughput)
    ks = sorted({k for row in throughput.values() for k in row})
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in ks:
        if k == 0:
            continue
        ax.plot(sizes, [throughput[b][k] / throughput[b][0] for b in sizes], marker="o", label=f"K={k}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (active rows)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
