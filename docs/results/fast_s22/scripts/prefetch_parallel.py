"""Session 22: the parallel drafters with the next draft made inside the update's graph (GraphedDrafter's prefetch)
against without it, inside generate(fast=True) on the fixture target (random heads: the step's cost, not tau).

Per drafter (P-EAGLE 8 levels, DFlash block 9, DSpark block 9 with its confidence gate), ``prefetch`` on / off /
on / off (env ``ORDER``, e.g. ``0011``; ``ONLY``: one drafter), each after two untimed calls (captures): ms per
step over N prompts x 128 new tokens, and whether the run's sequences equal the first run's.

    python docs/results/fast_s22/scripts/prefetch_parallel.py FIXTURE_DIR [PROMPTS]
"""
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec as sd
from specdec.graphs import GraphedDrafter
from specdec.heads import DFlashHead, DSparkHead, PEagleHead

F = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
dev = "cuda" if torch.cuda.is_available() else "cpu"
dt_ = torch.bfloat16 if dev == "cuda" else torch.float32
NEW = 128 if dev == "cuda" else 12
tok = AutoTokenizer.from_pretrained(f"{F}/pycoder-18m")
target = AutoModelForCausalLM.from_pretrained(f"{F}/pycoder-18m", dtype=dt_).to(dev).eval()
rows = [json.loads(line) for line in open(f"{F}/pycode-heldout.jsonl")][:N + 1]
prompts = [tok(r.get("prompt") or r.get("text"), return_tensors="pt").input_ids[:, -256:].to(dev) for r in rows]
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
torch.manual_seed(0)
heads = {
    "P-EAGLE 8": (sd.recipes.peagle, lambda: PEagleHead.from_target(target, num_layers=2, max_drafts=8)),
    "DFlash 9": (sd.recipes.dflash, lambda: DFlashHead.from_target(target, block_size=9, num_layers=2)),
    "DSpark 9": (sd.recipes.dspark, lambda: DSparkHead.from_target(target, block_size=9, num_layers=2)),
}
for name, (_, make) in heads.items():  # every head built here, in order, so each one's random weights stay put
    heads[name] = (heads[name][0], make())
ORDER = [bool(int(c)) for c in os.environ.get("ORDER", "1010")]  # prefetch per run, e.g. ORDER=0011
ONLY = os.environ.get("ONLY")  # one drafter's name, e.g. ONLY="DSpark 9"
table = []
for name, (recipe, make) in heads.items():
    if ONLY and name != ONLY:
        continue
    eager = recipe(make.to(dev, dt_), cuda_graphs=False)
    wrapped = {flag: GraphedDrafter(eager, prefetch=flag) for flag in (True, False)}
    first = None
    for flag in ORDER:
        drafter = wrapped[flag]

        def gen(p, drafter=drafter):
            return sd.generate(target, p, drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[])
        gen(prompts[0]); gen(prompts[0])  # noqa: E702  captures
        sync()
        t, steps, seqs, before = time.perf_counter(), 0, [], dict(drafter.counts)
        for p in prompts[1:]:
            out = gen(p)
            steps += out.stats.num_steps
            seqs.append(out.sequences)
        sync()
        ms = 1e3 * (time.perf_counter() - t) / steps
        same = first is None or all(torch.equal(a, b) for a, b in zip(first, seqs))
        first = first or seqs
        counts = {k: drafter.counts[k] - before[k] for k in drafter.counts}
        table.append((name, flag, ms, steps, same, counts))
        print(f"{name:10s} prefetch={flag!s:5s} {ms:6.3f} ms/step over {steps} steps, same sequences: {same}, "
              f"counts {counts}", flush=True)
print("\n| drafter | " + " | ".join(f"prefetch {'on' if f else 'off'}, ms/step" for f in ORDER) + " |\n|---|"
      + "---:|" * len(ORDER))
for name in heads:
    cells = [f"{r[2]:.3f}" for r in table if r[0] == name]
    print(f"| {name} | " + " | ".join(cells) + " |")
