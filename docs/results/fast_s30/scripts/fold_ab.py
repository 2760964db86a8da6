"""Session 30: the drafters' update and next draft folded into the fast path's verify step
(``GraphedDrafter(fold=True)``, the default now) against the three replays a step of before (``fold=False``).

Random heads from the fixture target (tau ~1-2: ~100-127 steps per 128-token call), bf16, greedy, batch 1, prompts
cut to their last 256 tokens; ``--methods``: P-EAGLE's chain of 8, DFlash's and DSpark's blocks of 8 (default),
EAGLE-2 / EAGLE-3 (their recipes' dynamic trees). Each prompt runs with the fold on, then off, drafter by drafter
(interleaved, ``--reps`` rounds): ms per step (medians, and the median of per-call ratios), folded steps, whether
the tokens agree; the drafts of one call compared; then the host's time per step by phase (perf_counter around
``fold_for``, ``forward_commit``, ``propose`` / ``update`` and ``step()``).

    python docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --out $OUT/fold.json
    python docs/results/fast_s30/scripts/fold_ab.py --fx .fixtures/fx --methods EAGLE-2 EAGLE-3
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
import specdec.static  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.heads import DFlashHead, DSparkHead, Eagle1Head, Eagle3Head, PEagleHead  # noqa: E402

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
    ap.add_argument("--methods", nargs="+", default=["P-EAGLE", "DFlash", "DSpark"],
                    choices=["P-EAGLE", "DFlash", "DSpark", "EAGLE-2", "EAGLE-3"])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (the fold needs captures: device_types)")
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
    heads = {"P-EAGLE": (sd.recipes.peagle, lambda: PEagleHead.from_target(target, num_layers=2, max_drafts=8)),
             "DFlash": (sd.recipes.dflash, lambda: DFlashHead.from_target(target, block_size=8, num_layers=2)),
             "DSpark": (sd.recipes.dspark, lambda: DSparkHead.from_target(target, block_size=8, num_layers=2)),
             "EAGLE-2": (sd.recipes.eagle2, lambda: Eagle1Head.from_target(target)),
             "EAGLE-3": (sd.recipes.eagle3, lambda: Eagle3Head.from_target(target))}
    drafters = {}
    for name in args.methods:
        recipe, make = heads[name]
        head = make()
        inner = recipe(head.to(device, torch.bfloat16).eval()).drafter
        if hasattr(inner, "fold"):  # EAGLE's fold is opt-in (EagleDrafter(fold=True)) since call E
            inner.fold = True
        on = dict(device_types=(device,)) if device == "cuda" else dict(device_types=(device,),
                                                                         capture=sd.graphs.capture_graph_ref)
        drafters[name] = {True: GraphedDrafter(inner, fold=True, **on), False: GraphedDrafter(inner, fold=False, **on)}

    def call(drafter, x):
        return sd.generate(target, x[None], drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)

    res, tokens = {}, {}
    for pair in drafters.values():  # captures first
        for drafter in pair.values():
            for x in ids:
                call(drafter, x)
    sync()
    # interleaved: each prompt runs with the fold on, then off, drafter by drafter (no drift between the two)
    per_step = {(name, fold): [] for name in drafters for fold in (True, False)}
    folded = {name: 0 for name in drafters}
    for _ in range(args.reps):
        for x in ids:
            for name, pair in drafters.items():
                for fold in (True, False):
                    before = pair[fold].counts["folded"]
                    t = time.perf_counter()
                    out = call(pair[fold], x)
                    sync()
                    per_step[(name, fold)].append(1e3 * (time.perf_counter() - t) / out.stats.num_steps)
                    folded[name] += pair[fold].counts["folded"] - before
                    tokens.setdefault((name, fold), []).append(out.sequences.tolist())
    for name in drafters:
        on, off = per_step[(name, True)], per_step[(name, False)]
        res[name] = {"fold on ms/step median": round(statistics.median(on), 4),
                     "fold off ms/step median": round(statistics.median(off), 4),
                     "on/off (median of per-call ratios)": round(statistics.median(a / b for a, b in zip(on, off)), 4),
                     "fold on mean": round(statistics.mean(on), 4), "fold off mean": round(statistics.mean(off), 4),
                     "calls": len(on), "folded steps (fold on)": folded[name],
                     "calls with the same tokens": sum(a == b for a, b in zip(tokens[(name, True)],
                                                                            tokens[(name, False)]))}
        print(f"{name:8s}", json.dumps(res[name]), flush=True)
    # the drafts themselves, fold on against off, over one call (bf16: do they differ, or only the tokens?)
    for name, pair in drafters.items():
        seen = {}
        for fold in (True, False):
            drafts, propose = [], pair[fold].propose

            def recorded(state, request, propose=propose, drafts=drafts):
                draft, state = propose(state, request)
                drafts.append((draft.tokens.clone(), draft.parents.clone()))
                return draft, state
            pair[fold].propose = recorded
            call(pair[fold], ids[0])
            del pair[fold].propose
            seen[fold] = drafts
        same = [torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(seen[True], seen[False])]
        first = same.index(False) if False in same else None
        res[f"{name} drafts"] = {"steps": len(same), "same drafts": sum(same), "first differing step": first}
        print(f"{name:8s} drafts fold on vs off:", json.dumps(res[f"{name} drafts"]), flush=True)
    timed(GraphedDrafter, "propose", "propose")
    timed(GraphedDrafter, "update", "update")
    timed(GraphedDrafter, "fold_for", "fold_for")
    timed(specdec.static.StaticAdapter, "forward_commit", "verify step")
    timed(specdec.step.LateTokens, "wait", "wait for tokens")
    timed(sys.modules["specdec.generate"], "step", "step()")
    for name, pair in drafters.items():
        for fold in (True, False):
            CLOCK.clear()
            steps, t = 0, time.perf_counter()
            for x in ids:
                steps += call(pair[fold], x).stats.num_steps
            sync()
            total = time.perf_counter() - t
            split = {k: round(1e3 * v / steps, 4) for k, v in sorted(CLOCK.items())}
            split["wall"] = round(1e3 * total / steps, 4)
            res[f"{name} fold={'on' if fold else 'off'} host split"] = split
            print(f"{name} fold={'on' if fold else 'off'} host ms/step:", json.dumps(split), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
