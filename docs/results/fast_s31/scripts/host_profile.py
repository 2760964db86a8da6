"""Session 31: where a host-bound fast step spends its host time (prompt lookup folded, P-EAGLE-shaped steps).

Fixture target, bf16, greedy, batch 1, 128 new tokens, ``PromptLookupDrafter(num_drafts=10, fixed_width=True)``
graphed (the fold on). After warm-up calls: the wall time per step, the device's busy time per step (torch.profiler,
CUDA kernels and copies) and a cProfile of ``--calls`` calls (the functions with the most own time and the most
cumulative time, per step).

    python docs/results/fast_s31/scripts/host_profile.py --fx .fixtures/fx --out $OUT/host
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
import specdec as sd  # noqa: E402
from specdec.drafters import PromptLookupDrafter  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import transformers
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.fx, "pycoder-18m")
    target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(args.device).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        texts = [json.loads(line)["prompt"] for line in fh]
    ids = [t for t in (tok(p, return_tensors="pt").input_ids[0] for p in texts) if t.shape[0] >= 256]
    ids = [t[-256:].to(args.device)[None] for t in ids[:3]]
    drafters = {"lookup folded": GraphedDrafter(PromptLookupDrafter(num_drafts=10, fixed_width=True)),
                "plain": None}

    def call(drafter, x):
        return sd.generate(target, x, drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    res = {}
    for name, drafter in drafters.items():
        for x in ids:
            call(drafter, x)
        sync()
        steps, t = 0, time.perf_counter()
        for i in range(args.calls):
            steps += call(drafter, ids[i % len(ids)]).stats.num_steps
        sync()
        wall = 1e3 * (time.perf_counter() - t) / steps
        busy = None
        if torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                n = call(drafter, ids[0]).stats.num_steps
                sync()
            events = [e for e in prof.events() if e.device_type.name == "CUDA"]
            busy = sum(e.device_time for e in events) / 1e3 / n
        prof_c = cProfile.Profile()
        steps = 0
        prof_c.enable()
        for i in range(args.calls):
            steps += call(drafter, ids[i % len(ids)]).stats.num_steps
        sync()
        prof_c.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof_c, stream=text)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(45)
        with open(os.path.join(args.out, f"{name.replace(' ', '_')}.prof.txt"), "w") as fh:
            fh.write(f"steps {steps}\n" + text.getvalue())
        res[name] = {"wall ms/step": round(wall, 4), "device busy ms/step": None if busy is None else round(busy, 4),
                     "profiled steps": steps}
        print(name, json.dumps(res[name]), flush=True)
    with open(os.path.join(args.out, "host.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
