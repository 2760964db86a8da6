"""Session 18: per-step time of the parallel drafters on the fast path (fixture target, random-init heads).

Call H timed P-EAGLE at 3.4 ms per step (407 tok/s, tau 1.40) against EAGLE-2's 1.3 ms: this times each drafter's
step alone, with its GraphedDrafter's counters (captures, replays, eager steps, buffer changes) and a profiled
run's phase times, to find where the time goes.
Usage: python diag_parallel.py FIXTURE_DIR [PROMPTS [NEW_TOKENS [PEAGLE_HEAD]]]

Call I (this script without ``eos_token_id=[]``) stopped at the model's EOS check: a host sync per step, so every
step cost its host time plus its GPU time (1.1-1.5 ms); the timed calls now pass ``eos_token_id=[]`` as
``bench_fast.py`` does, and one call per method counts the host syncs (``torch.cuda.set_sync_debug_mode``).
"""
import json
import sys
import time
import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec as sd
from specdec.heads import DFlashHead, Eagle3Head, MedusaHead, PEagleHead

F = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
dev = "cuda" if torch.cuda.is_available() else "cpu"
dt_ = torch.bfloat16 if dev == "cuda" else torch.float32
NEW = int(sys.argv[3]) if len(sys.argv) > 3 else 128
tok = AutoTokenizer.from_pretrained(f"{F}/pycoder-18m")
target = AutoModelForCausalLM.from_pretrained(f"{F}/pycoder-18m", dtype=dt_).to(dev).eval()
rows = [json.loads(line) for line in open(f"{F}/pycode-heldout.jsonl")][:N + 1]
prompts = [tok(r.get("prompt") or r.get("text"), return_tensors="pt").input_ids[:, -256:].to(dev) for r in rows]
torch.manual_seed(0)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
makers = {
    "plain": lambda: None,
    "EAGLE-3 (random head)": lambda: sd.recipes.eagle3(Eagle3Head.from_target(target).to(dev, dt_).eval()),
    "P-EAGLE chain 8": lambda: sd.recipes.peagle(
        PEagleHead.from_target(target, num_layers=2, max_drafts=8).to(dev, dt_).eval()),
    "DFlash chain 8": lambda: sd.recipes.dflash(
        DFlashHead.from_target(target, block_size=8, num_layers=2).to(dev, dt_).eval()),
    "P-EAGLE trained": lambda: sd.recipes.peagle(sd.formats.load_peagle_head(sys.argv[4], target)),
    "Medusa mc_sim_7b_63": lambda: sd.recipes.medusa(
        MedusaHead.from_target(target, num_heads=5).to(dev, dt_).eval()),
}
print(f"{'method':24s} {'ms/step':>8s} {'tok/s':>8s} {'tau':>5s}  counts / phases (ms per step)")
if len(sys.argv) <= 4:
    del makers["P-EAGLE trained"]
for name, make in makers.items():
    drafter = make()
    out = sd.generate(target, prompts[0], drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[])  # capture
    counts0 = dict(getattr(drafter, "counts", {}))
    sync()
    t, steps, toks = time.perf_counter(), 0, 0
    for p in prompts[1:]:
        out = sd.generate(target, p, drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[])
        steps += out.stats.num_steps
        toks += out.stats.num_new_tokens
    sync()
    dt = time.perf_counter() - t
    counts = {k: v - counts0.get(k, 0) for k, v in getattr(drafter, "counts", {}).items()}
    if dev == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sd.generate(target, prompts[1], drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[])
    if dev == "cuda":
        torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    counts["syncs per step"] = round(syncs / out.stats.num_steps, 2)
    prof = sd.generate(target, prompts[1], drafter=drafter, max_new_tokens=NEW, fast=True, eos_token_id=[],
                       profile=True).stats
    phases = {k: round(1e3 * v / prof.num_steps, 3) for k, v in (prof.phase_times or {}).items()}
    print(f"{name:24s} {1e3 * dt / steps:8.3f} {toks / dt:8.0f} {toks / steps:5.2f}  {counts} {phases}", flush=True)
