"""Session 29, call A: where does the host spend a parallel drafter's fast step on the H200?

Random heads from the fixture target (tau ~1: 127 steps per 128-token call), bf16, greedy, batch 1, prompts cut to
their last 256 tokens. For plain decoding, P-EAGLE's chain of 8 and DFlash's block of 8 (with and without
``prefetch``): the per-step wall time, and the host's time per step split by phase (perf_counter around the
drafter's ``propose`` / ``update``, the adapter's captured verify step, the wait for the late tokens, the rest of the
loop), then the CPU side of one call under ``torch.profiler``: the runtime calls and ops with the most host time
per step (``cudaGraphLaunch``, ``cudaLaunchKernel``, ``aten::copy_`` ...).

    python docs/results/fast_s29/scripts/host_split.py --fx .fixtures/fx --out $OUT/host.json

``--ab``: instead, the parallel drafters and EAGLE-2 (random heads) with the replays' input copies and output clones
grouped (``specdec.graphs.copy_all`` / ``clone_all``: one ``torch._foreach_copy_`` per dtype) against one ``copy_`` /
``clone`` per tensor (as before session 29), alternating twice in one process. (Run in call D against a working-tree
change that added ``copy_all`` / ``clone_all``; grouping was slower and did not land, so ``--ab`` now stops with a
message.)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
import specdec as sd  # noqa: E402
import specdec.generate  # noqa: E402
import specdec.static  # noqa: E402
import specdec.step  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.heads import DFlashHead, PEagleHead  # noqa: E402

CLOCK = collections.defaultdict(float)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(owner, name: str, phase: str) -> None:
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK[phase] += time.perf_counter() - t
    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ab", action="store_true")
    args = ap.parse_args()
    import transformers
    device = args.device
    target = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(args.fx, "pycoder-18m"),
                                                               dtype=torch.bfloat16).to(device).eval()
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(args.fx, "pycoder-18m"))
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        prompts = [json.loads(line)["prompt"] for line in fh][:args.prompts]
    ids = [tok(p, return_tensors="pt").input_ids[0, -256:].to(device) for p in prompts]
    torch.manual_seed(0)
    pe = PEagleHead.from_target(target, num_layers=2, max_drafts=8).to(device, torch.bfloat16).eval()
    df = DFlashHead.from_target(target, block_size=8, num_layers=2).to(device, torch.bfloat16).eval()
    drafters = {"plain": None, "P-EAGLE": sd.recipes.peagle(pe), "DFlash": sd.recipes.dflash(df),
                "P-EAGLE prefetch": GraphedDrafter(sd.recipes.peagle(pe).drafter, prefetch=True),
                "DFlash prefetch": GraphedDrafter(sd.recipes.dflash(df).drafter, prefetch=True)}
    if args.ab:
        return ab(target, ids, pe, df, args)
    timed(GraphedDrafter, "propose", "propose")
    timed(GraphedDrafter, "update", "update")
    timed(specdec.static.StaticAdapter, "forward_commit", "verify step")
    timed(specdec.static.StaticAdapter, "decode_argmax", "plain forward")
    timed(specdec.step.LateTokens, "wait", "wait for tokens")
    timed(sys.modules["specdec.generate"], "step", "step()")
    res = {}
    for name, drafter in drafters.items():
        def run(x):
            return sd.generate(target, x[None], drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)
        for x in ids:
            run(x)
        sync()
        CLOCK.clear()
        calls, steps = [], 0
        for _ in range(args.reps):
            for x in ids:
                t = time.perf_counter()
                out = run(x)
                sync()
                calls.append(time.perf_counter() - t)
                steps += out.stats.num_steps
        total = sum(calls)
        split = {k: round(1e3 * v / steps, 4) for k, v in sorted(CLOCK.items())}
        split["other (generate loop, rows, stats)"] = round(1e3 * (total - CLOCK["step()"] - CLOCK["wait for tokens"])
                                                            / steps, 4)
        res[name] = {"ms_per_step": round(1e3 * total / steps, 4), "call_ms_median": round(
            1e3 * statistics.median(calls), 2), "steps_per_call": steps / len(calls), "host_ms_per_step": split}
        print(name, json.dumps(res[name]), flush=True)
    for name in ("P-EAGLE", "DFlash", "plain"):
        drafter = drafters[name]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = sd.generate(target, ids[0][None], drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)
            sync()
        steps = out.stats.num_steps
        avg = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
        top = sorted(avg, key=lambda e: -e.self_cpu_time_total)[:25]
        res[f"{name} cpu"] = [(e.key[:70], round(e.count / steps, 2), round(e.self_cpu_time_total / steps, 2))
                              for e in top]
        print(f"== {name}: host self time per step by event (us), {steps} steps", flush=True)
        for k, c, us in res[f"{name} cpu"]:
            print(f"   {us:8.2f} us/step  x{c:5.2f}  {k}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


def _loop_copy_all(destinations, sources) -> None:
    for dst, src in zip(destinations, sources):
        dst.copy_(src)


def _loop_clone_all(tree):
    return specdec.graphs._map(torch.Tensor.clone, tree)


def ab(target, ids, pe, df, args) -> None:
    import specdec.graphs as graphs
    if not hasattr(graphs, "copy_all"):
        raise SystemExit("--ab needs specdec.graphs.copy_all / clone_all (session 29's trial change, not landed)")
    grouped = (graphs.copy_all, graphs.clone_all)
    drafters = {"P-EAGLE": sd.recipes.peagle(pe), "DFlash": sd.recipes.dflash(df),
                "EAGLE-2": sd.recipes.eagle2(sd.heads.Eagle1Head.from_target(target).to(target.device,
                                                                                     torch.bfloat16).eval())}
    res = {}
    for run in ("grouped", "loop", "grouped 2", "loop 2"):
        on = not run.startswith("loop")
        graphs.copy_all, graphs.clone_all = grouped if on else (_loop_copy_all, _loop_clone_all)
        specdec.static.copy_all = graphs.copy_all
        for name, drafter in drafters.items():
            def go(x):
                return sd.generate(target, x[None], drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)
            for x in ids:
                go(x)
            sync()
            calls, steps = [], 0
            for _ in range(args.reps):
                for x in ids:
                    t = time.perf_counter()
                    out = go(x)
                    sync()
                    calls.append(time.perf_counter() - t)
                    steps += out.stats.num_steps
            res[f"{name} {run}"] = {"ms_per_step": round(1e3 * sum(calls) / steps, 4),
                                    "call_ms_median": round(1e3 * statistics.median(calls), 2)}
            print(f"{name:8s} {run:10s}", json.dumps(res[f"{name} {run}"]), flush=True)
    graphs.copy_all, graphs.clone_all = grouped
    specdec.static.copy_all = graphs.copy_all
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
