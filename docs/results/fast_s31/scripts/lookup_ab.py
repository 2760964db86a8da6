"""Session 31: prompt lookup's steps captured (a static history written in place, no host sync) and folded into the
fast path's verify step, against the same drafter run eagerly beside the fast target.

Fixture target, bf16, greedy, prompts cut to their last 256 tokens, 128 new tokens, ``PromptLookupDrafter(
num_drafts=K, fixed_width=True)``. Variants, interleaved prompt by prompt (``--reps`` rounds): ``fast plain`` (no
drafter), ``lookup eager`` (the drafter's propose / update as eager torch ops: a ``GraphedDrafter`` capturing on
no device), ``lookup graphed`` (its steps as CUDA graphs, ``fold=False``: three replays a step), ``lookup folded``
(the default: the update and the next lookup inside the verify step's graph, one replay a step). Batch 1, then
``--batch`` rows of different prompts (left-padded). Prints ms per step and tokens/s (medians over the calls), tau,
and whether each variant's tokens equal the eager drafter's.

    python docs/results/fast_s31/scripts/lookup_ab.py --fx .fixtures/fx --out $OUT/lookup.json
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
from specdec.drafters import PromptLookupDrafter  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.kernels import ngram_chain_ref  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--batch", type=int, nargs="*", default=[4, 16])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--torch-search", action="store_true",
                    help="also the eager and folded drafters with the n-gram search as torch ops (call D)")
    args = ap.parse_args()
    import transformers
    device = args.device
    path = os.path.join(args.fx, "pycoder-18m")
    target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        texts = [json.loads(line)["prompt"] for line in fh]
    ids = [t for t in (tok(p, return_tensors="pt").input_ids[0] for p in texts) if t.shape[0] >= 256]
    ids = [t[-256:].to(device) for t in ids[:max(args.prompts, *args.batch, 1)]]

    def lookup():
        return PromptLookupDrafter(num_drafts=args.k, fixed_width=True)
    variants = {"fast plain": None,
                "lookup eager": GraphedDrafter(lookup(), device_types=()),
                "lookup graphed": GraphedDrafter(lookup(), fold=False),
                "lookup folded": GraphedDrafter(lookup())}
    torch_search = set()
    if args.torch_search:  # the same drafters with the search as torch ops (ngram_chain_ref), not the kernel
        variants["lookup eager, torch search"] = GraphedDrafter(lookup(), device_types=())
        variants["lookup folded, torch search"] = GraphedDrafter(lookup())
        torch_search = {id(variants["lookup eager, torch search"]), id(variants["lookup folded, torch search"])}

    def call(drafter, x, mask=None):
        module = sys.modules["specdec.drafters.prompt_lookup"]
        kernel = module.ngram_chain
        if id(drafter) in torch_search:  # around the whole call: its captures record the reference's ops
            module.ngram_chain = ngram_chain_ref
        try:
            return sd.generate(target, x, attention_mask=mask, drafter=drafter, max_new_tokens=128,
                               eos_token_id=[], fast=True)
        finally:
            module.ngram_chain = kernel

    def batched(rows):  # left-padded rows of different prompts (all 256 long here: no padding needed)
        return torch.stack(rows), None

    res = {}
    for batch in (1, *args.batch):
        inputs = ([(x[None], None) for x in ids[:args.prompts]] if batch == 1 else
                  [batched([ids[(i + j) % len(ids)] for j in range(batch)]) for i in range(2)])
        for drafter in variants.values():  # captures first
            for x, m in inputs:
                call(drafter, x, m)
        sync()
        ms, tps, tau, seqs, folded = ({name: [] for name in variants} for _ in range(5))
        for _ in range(args.reps):
            for x, m in inputs:
                for name, drafter in variants.items():
                    before = drafter.counts["folded"] if drafter is not None else 0
                    t = time.perf_counter()
                    out = call(drafter, x, m)
                    sync()
                    dt = time.perf_counter() - t
                    ms[name].append(1e3 * dt / max(out.stats.num_steps, 1))
                    tps[name].append(out.stats.num_new_tokens / dt)
                    tau[name].append(out.stats.tau)
                    seqs[name].append(out.sequences.tolist())
                    folded[name].append((drafter.counts["folded"] - before) if drafter is not None else 0)
        rows = {}
        for name in variants:
            rows[name] = {"ms/step": round(statistics.median(ms[name]), 4),
                          "tok/s": round(statistics.median(tps[name]), 1),
                          "tau": round(statistics.mean(tau[name]), 3), "calls": len(ms[name]),
                          "folded steps per call": round(statistics.mean(folded[name]), 1),
                          "same tokens as eager": sum(
                              a == b for a, b in zip(seqs[name], seqs["lookup eager"]))}
        res[f"batch {batch}"] = rows
        print(f"== batch {batch} ({len(inputs)} inputs x {args.reps})", flush=True)
        for name, row in rows.items():
            print(f"  {name:28s}", json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
    print(f"{'batch':>5} {'variant':28s} {'ms/step':>8} {'tok/s':>9} {'tau':>6} {'same':>5}")
    for key, rows in res.items():
        for name, row in rows.items():
            print(f"{key[6:]:>5} {name:28s} {row['ms/step']:8.3f} {row['tok/s']:9.1f} {row['tau']:6.2f} "
                  f"{row['same tokens as eager']:>2}/{row['calls']}")


if __name__ == "__main__":
    main()
