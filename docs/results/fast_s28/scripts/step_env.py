"""Session 28, call A: does the benchmark process slow the parallel drafters' fast steps, and where does P-EAGLE's
step spend more device time than DFlash's?

Random heads from the fixture target (tau ~1: 127 steps per 128-token call), bf16, greedy, batch 1, prompts cut to
their last 256 tokens. Per stage, the median per-call wall time and per-step time of ``generate(fast=True)`` for
plain decoding, P-EAGLE's chain of 8 and DFlash's block of 8:

1. ``base``: a process with specdec alone (as session 27's call G);
2. ``cudnn-off``: ``torch.backends.cuda.enable_cudnn_sdp(False)`` (bench_fast's setting, the anchor's);
3. ``gpt-fast``: after gpt-fast's vanilla decoding is compiled (``reduce-overhead``) and run in the process, as
   ``examples/bench_fast.py --gptfast`` does.

Then (``--kernels``) one call per drafter under ``torch.profiler`` with CUDA activity: kernels per step and the top
kernels by device time.

    python docs/results/fast_s28/scripts/step_env.py --fx .fixtures/fx --kernels --out $OUT/env.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))
import specdec as sd  # noqa: E402
from specdec.heads import DFlashHead, PEagleHead  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_calls(run, ids, reps: int) -> dict:
    for x in ids:  # captures, warm-up
        run(x)
    sync()
    calls, steps = [], []
    for _ in range(reps):
        for x in ids:
            t = time.perf_counter()
            out = run(x)
            sync()
            calls.append(time.perf_counter() - t)
            steps.append(out.stats.num_steps)
    med = statistics.median(calls)
    return {"call_ms_median": round(1e3 * med, 2), "call_ms_min": round(1e3 * min(calls), 2),
            "call_ms_max": round(1e3 * max(calls), 2), "steps": statistics.median(steps),
            "ms_per_step": round(1e3 * sum(calls) / sum(steps), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-gptfast", action="store_true", help="skip stage 3 (a CPU smoke run)")
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
    drafters = {"plain": None,
                "P-EAGLE": sd.recipes.peagle(PEagleHead.from_target(target, num_layers=2, max_drafts=8)
                                             .to(device, torch.bfloat16).eval()),
                "DFlash": sd.recipes.dflash(DFlashHead.from_target(target, block_size=8, num_layers=2)
                                            .to(device, torch.bfloat16).eval())}

    def runner(drafter):
        def run(x):
            return sd.generate(target, x[None], drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)
        return run

    res = {}

    def stage(name):
        res[name] = {k: time_calls(runner(d), ids, args.reps) for k, d in drafters.items()}
        print(name, json.dumps(res[name]), flush=True)

    stage("base")
    torch.backends.cuda.enable_cudnn_sdp(False)
    stage("cudnn-off")
    if args.no_gptfast:
        return
    import bench_fast
    gf = bench_fast.gptfast_methods(os.path.join(args.fx, "anchors"), target, None, [], 128, device,
                                    torch.bfloat16)["gpt-fast vanilla"]
    for x in ids:
        gf(x)
    sync()
    t = time.perf_counter()
    for x in ids:
        gf(x)
    sync()
    res["gpt-fast vanilla call ms"] = round(1e3 * (time.perf_counter() - t) / len(ids), 2)
    print("gpt-fast vanilla call ms", res["gpt-fast vanilla call ms"], flush=True)
    stage("gpt-fast")
    if args.kernels:
        for name in ("P-EAGLE", "DFlash", "plain"):
            run = runner(drafters[name])
            run(ids[0])
            sync()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                out = run(ids[0])
                sync()
            avg = prof.key_averages()
            kernels = [e for e in avg if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
            n = sum(e.count for e in kernels)
            total = sum(e.self_device_time_total for e in kernels)
            steps = out.stats.num_steps
            res[f"{name} kernels"] = {"per_step": round(n / steps, 1), "device_us_per_step": round(total / steps, 1),
                                      "top": [(e.key[:90], e.count, round(e.self_device_time_total / steps, 2))
                                              for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:30]]}
            print(f"== {name}: {steps} steps, {n / steps:.1f} kernels/step, {total / steps:.1f} us device/step",
                  flush=True)
            for k, c, us in res[f"{name} kernels"]["top"]:
                print(f"   {us:8.2f} us/step  x{c / steps:5.2f}  {k}", flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
