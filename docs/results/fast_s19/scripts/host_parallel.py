"""Session 19: is P-EAGLE's generate() step bound by the host? (cProfile + CUDA API calls per step, by drafter).

Call L (session 19) timed P-EAGLE at 1.556 ms per step inside ``generate()`` while ``prof_parallel.py`` gave its
phases the same GPU busy time as DFlash's (~0.52 ms per step; DFlash's step 0.875 ms). This runs each drafter
(random heads: P-EAGLE 8 levels, DFlash block 9 = 8 levels, DSpark block 9 with its confidence gate, plain) through
``generate(fast=True)`` on a few prompts and prints, per step: wall time, GPU busy time, CUDA API calls by name
(graph launches, kernel launches, copies, syncs, event queries) and the host functions that take the most time.

    python docs/results/fast_s19/scripts/host_parallel.py FIXTURE_DIR [PROMPTS]     # GPU; CPU: a smoke run
"""
import collections
import cProfile
import io
import json
import pstats
import sys
import time

import torch
from torch.autograd import DeviceType
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec as sd
from specdec.heads import DFlashHead, DSparkHead, PEagleHead

F = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 3
dev = "cuda" if torch.cuda.is_available() else "cpu"
dt_ = torch.bfloat16 if dev == "cuda" else torch.float32
NEW = 128 if dev == "cuda" else 16
tok = AutoTokenizer.from_pretrained(f"{F}/pycoder-18m")
target = AutoModelForCausalLM.from_pretrained(f"{F}/pycoder-18m", dtype=dt_).to(dev).eval()
rows = [json.loads(line) for line in open(f"{F}/pycode-heldout.jsonl")][:N + 1]
prompts = [tok(r.get("prompt") or r.get("text"), return_tensors="pt").input_ids[:, -256:].to(dev) for r in rows]
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
torch.manual_seed(0)
makers = {
    "plain": lambda: None,
    "P-EAGLE 8": lambda: sd.recipes.peagle(PEagleHead.from_target(target, num_layers=2, max_drafts=8).to(dev, dt_)),
    "DFlash 9": lambda: sd.recipes.dflash(DFlashHead.from_target(target, block_size=9, num_layers=2).to(dev, dt_)),
    "DSpark 9": lambda: sd.recipes.dspark(DSparkHead.from_target(target, block_size=9, num_layers=2).to(dev, dt_)),
    "P-EAGLE 7": lambda: sd.recipes.peagle(PEagleHead.from_target(target, num_layers=2, max_drafts=7).to(dev, dt_)),
    "DFlash 8": lambda: sd.recipes.dflash(DFlashHead.from_target(target, block_size=8, num_layers=2).to(dev, dt_)),
}
only = sys.argv[3:]
summary = []
for name, make in makers.items():
    if only and name not in only:
        continue
    drafter = make()

    def gen(p, drafter=drafter):
        return sd.generate(target, p, drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[])
    gen(prompts[0]); gen(prompts[0])  # noqa: E702  captures
    sync()
    t, steps = time.perf_counter(), 0
    for p in prompts[1:]:
        steps += gen(p).stats.num_steps
    sync()
    wall = 1e3 * (time.perf_counter() - t) / steps
    pr = cProfile.Profile()
    pr.enable()
    out = gen(prompts[1])
    sync()
    pr.disable()
    n = out.stats.num_steps
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(14)
    st.sort_stats("cumtime").print_stats("specdec", 22)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        out = gen(prompts[1])
        sync()
    n2 = out.stats.num_steps
    ev = list(prof.events())
    api = collections.Counter(e.name for e in ev if e.device_type != DeviceType.CUDA and e.name.startswith("cuda"))
    api_us = collections.Counter()
    for e in ev:
        if e.device_type != DeviceType.CUDA and e.name.startswith("cuda"):
            api_us[e.name] += e.time_range.end - e.time_range.start
    held = {k: {"builds": v["builds"], "captures": v["captures"]} for k, v in sd.static.held_graphs(target).items()}
    busy = sum(e.time_range.end - e.time_range.start for e in ev if e.device_type == DeviceType.CUDA)
    ops = collections.Counter(e.name for e in ev if e.device_type != DeviceType.CUDA and e.name.startswith("aten::"))
    print(f"##### {name}: {wall:.3f} ms/step (wall, {steps} steps), tau {out.stats.tau:.2f}, "
          f"GPU busy {busy / n2:.0f} us/step, counts {getattr(drafter, 'counts', {})}", flush=True)
    print("  CUDA API per step:", {k: round(v / n2, 2) for k, v in api.most_common(12)})
    print("  CUDA API us per step:", {k: round(v / n2, 1) for k, v in api_us.most_common(8)}, "target graphs:", held)
    print("  aten ops per step:", {k: round(v / n2, 1) for k, v in ops.most_common(14)})
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip() and "function calls" not in line))
    summary.append((name, wall, busy / n2, sum(api.values()) / n2))
print(f"\n{'drafter':12s} {'ms/step':>8s} {'GPU us':>7s} {'API/step':>9s}")
for name, wall, busy, calls in summary:
    print(f"{name:12s} {wall:8.3f} {busy:7.0f} {calls:9.1f}")
