"""Session 33: graphed drafters reading the verify step's outputs where they lie (``GraphedDrafter.in_place``)
against copying them into their captured inputs (session 32's code path).

Fixture target, random heads, bf16, greedy, batch 1, prompts cut to their last 256 tokens, 128 new tokens,
``generate(fast=True)``; EAGLE's fold off (its default), so each step runs the update's graph. One wrapper per
method, its ``in_place`` attribute flipped call by call (the graphs of both ways captured before the timed rounds):
per prompt "on" then "off", ``--reps`` rounds; ms per step (medians, and the median of per-call ratios), whether the
tokens agree, and the wrapper's ``in_place`` count (replays that read some inputs in place).

    python docs/results/fast_s33/scripts/inplace_ab.py --fx .fixtures/fx --out $OUT/inplace_ab.json
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
import specdec as sd  # noqa: E402
from specdec.heads import Eagle1Head, Eagle3Head, MedusaHead  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--methods", nargs="+", default=["EAGLE-2", "EAGLE-3", "Medusa"])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import transformers
    dev = args.device
    path = os.path.join(args.fx, "pycoder-18m")
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(dev).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        texts = [json.loads(line)["prompt"] for line in fh]
    ids = [t for t in (tok(p, return_tensors="pt").input_ids[0] for p in texts) if t.shape[0] >= 256]
    ids = [t[-256:].to(dev)[None] for t in ids[:args.prompts]]
    torch.manual_seed(0)
    kw = dict(device=dev, dtype=dtype)
    makers = {"EAGLE-2": lambda: sd.recipes.eagle2(Eagle1Head.from_target(target).to(**kw).eval()),
              "EAGLE-3": lambda: sd.recipes.eagle3(Eagle3Head.from_target(target).to(**kw).eval()),
              "Medusa": lambda: sd.recipes.medusa1(MedusaHead.from_target(target).to(**kw).eval())}
    drafters = {name: makers[name]() for name in args.methods}
    if dev != "cuda":  # a smoke run: graph on CPU through the reference capture
        from specdec.graphs import GraphedDrafter, capture_graph_ref
        drafters = {n: GraphedDrafter(d.drafter, capture=capture_graph_ref, device_types=("cpu",))
                    for n, d in drafters.items()}

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def call(drafter, x, on):
        drafter.in_place = on
        return sd.generate(target, x, drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)

    for drafter in drafters.values():  # captures first, both ways
        for x in ids:
            call(drafter, x, True)
            call(drafter, x, False)
    sync()
    per_step = {(n, v): [] for n in drafters for v in (True, False)}
    tokens = {(n, v): [] for n in drafters for v in (True, False)}
    counts = {n: dict(d.counts) for n, d in drafters.items()}
    for _ in range(args.reps):
        for x in ids:
            for name, drafter in drafters.items():
                for on in (True, False):
                    sync()
                    t = time.perf_counter()
                    out = call(drafter, x, on)
                    sync()
                    per_step[(name, on)].append(1e3 * (time.perf_counter() - t) / out.stats.num_steps)
                    tokens[(name, on)].append(out.sequences.tolist())
    res = {}
    for name, drafter in drafters.items():
        on, off = per_step[(name, True)], per_step[(name, False)]
        res[name] = {"in place ms/step": round(statistics.median(on), 4),
                     "copied ms/step": round(statistics.median(off), 4),
                     "in place / copied (median of per-call ratios)": round(
                         statistics.median(a / b for a, b in zip(on, off)), 4),
                     "calls": len(on),
                     "calls with the same tokens": sum(a == b for a, b in zip(tokens[(name, True)],
                                                                            tokens[(name, False)])),
                     "timed replays read in place": drafter.counts["in_place"] - counts[name]["in_place"],
                     "captures while timed": drafter.counts["captures"] - counts[name]["captures"],
                     "graphs reading in place": len(drafter.in_place_keys)}
        print(f"{name:8s}", json.dumps(res[name]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
