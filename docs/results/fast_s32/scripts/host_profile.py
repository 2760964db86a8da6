"""Session 32: where a fixture tree step's host time goes (EAGLE-2 / EAGLE-3 with random heads, prompt lookup, plain).

Fixture target, bf16, greedy, batch 1, 128 new tokens, ``generate(fast=True)``. After warm-up calls: the wall time
per step, the device's busy time per step (torch.profiler, CUDA kernels and copies), a perf_counter split of the
verify step (``StaticAdapter._bucket_inputs``, ``forward_commit``, ``_late_committed``), the device kernels by name
(``<method>.kernels.txt``; added after call A, which ran without it) and a cProfile of ``--calls`` calls (most own
time, most cumulative time).

    python docs/results/fast_s32/scripts/host_profile.py --fx .fixtures/fx --out $OUT/host
"""
from __future__ import annotations

import argparse
import collections
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
import specdec.static as st  # noqa: E402
from specdec.heads import Eagle1Head, Eagle3Head  # noqa: E402

CLOCK = collections.defaultdict(float)


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
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", nargs="+", default=["EAGLE-2", "EAGLE-3", "lookup", "plain"])
    args = ap.parse_args()
    import transformers
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.fx, "pycoder-18m")
    dev = args.device
    target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        texts = [json.loads(line)["prompt"] for line in fh]
    ids = [t for t in (tok(p, return_tensors="pt").input_ids[0] for p in texts) if t.shape[0] >= 256]
    ids = [t[-256:].to(dev)[None] for t in ids[:3]]
    torch.manual_seed(0)
    makers = {"EAGLE-2": lambda: sd.recipes.eagle2(Eagle1Head.from_target(target).to(dev, torch.bfloat16).eval()),
              "EAGLE-3": lambda: sd.recipes.eagle3(Eagle3Head.from_target(target).to(dev, torch.bfloat16).eval()),
              "lookup": lambda: sd.recipes.prompt_lookup(num_drafts=10, fixed_width=True),
              "plain": lambda: None}
    for name, phase in (("_bucket_inputs", "bucket inputs"), ("forward_commit", "forward_commit"),
                        ("_late_committed", "late committed")):
        timed(st.StaticAdapter, name, phase)

    def call(recipe, x):
        kw = {} if recipe is None else dict(drafter=recipe)
        return sd.generate(target, x, max_new_tokens=128, eos_token_id=[], fast=True, **kw)

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    res = {}
    for name in args.methods:
        recipe = makers[name]()
        for x in ids:
            call(recipe, x)
        sync()
        CLOCK.clear()
        steps, t = 0, time.perf_counter()
        for i in range(args.calls):
            steps += call(recipe, ids[i % len(ids)]).stats.num_steps
        sync()
        wall = 1e3 * (time.perf_counter() - t) / steps
        split = {k: round(1e3 * v / steps, 4) for k, v in CLOCK.items()}
        busy = None
        if torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                n = call(recipe, ids[0]).stats.num_steps
                sync()
            events = [e for e in prof.events() if e.device_type.name == "CUDA"]
            busy = sum(e.device_time for e in events) / 1e3 / n
            by_name = collections.defaultdict(lambda: [0, 0.0])
            for e in events:
                by_name[e.name[:60]][0] += 1
                by_name[e.name[:60]][1] += e.device_time
            top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:30]
            with open(os.path.join(args.out, f"{name.replace(' ', '_')}.kernels.txt"), "w") as fh:
                fh.write(f"{len(events) / n:.1f} device events per step, {busy:.4f} ms busy per step\n")
                for k, (count, us) in top:
                    fh.write(f"{count / n:8.2f}/step {us / n:9.2f} us/step  {k}\n")
        prof_c = cProfile.Profile()
        steps_c = 0
        prof_c.enable()
        for i in range(args.calls):
            steps_c += call(recipe, ids[i % len(ids)]).stats.num_steps
        sync()
        prof_c.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof_c, stream=text)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)
        with open(os.path.join(args.out, f"{name.replace(' ', '_')}.prof.txt"), "w") as fh:
            fh.write(f"steps {steps_c}\n" + text.getvalue())
        res[name] = {"wall ms/step": round(wall, 4), "device busy ms/step": None if busy is None else round(busy, 4),
                     "steps": steps, "host split ms/step": split}
        print(name, json.dumps(res[name]), flush=True)
    with open(os.path.join(args.out, "host.json"), "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
