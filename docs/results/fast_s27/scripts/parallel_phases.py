"""Session 27, call F: why P-EAGLE's fast step (1.52 ms, call E) is slower than DFlash's (1.20 ms) on the fixture.

Random heads from the fixture target (the step's time does not depend on the weights; tau ~1, so 127 steps per
prompt), bf16, greedy, batch 1, 3 prompts of 256 tokens, 128 new tokens: ``generate(profile=True)``'s phases per
step, the unprofiled step and prefill, and the top host-side ops of one call (torch.profiler, CPU time).

    python docs/results/fast_s27/scripts/parallel_phases.py --fx .fixtures/fx

Call G added ``--peagle`` / ``--dflash`` (trained heads beside the random ones). ``--kernels`` (the device kernels
of one call per head, for the P-EAGLE / DFlash step difference) was written for a call H that the session's device
time did not allow: not run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
import specdec as sd  # noqa: E402
from specdec.heads import DFlashHead, PEagleHead  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--kernels", action="store_true", help="call H: the device kernels of one call per head")
    ap.add_argument("--peagle", default=None, help="a trained P-EAGLE head folder too (call G)")
    ap.add_argument("--dflash", default=None, help="a trained DFlash head folder too (call G)")
    args = ap.parse_args()
    import transformers
    target = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(args.fx, "pycoder-18m"),
                                                               dtype=torch.bfloat16).to(args.device).eval()
    lines = open(os.path.join(args.fx, "pycode-heldout.jsonl"))
    prompts = [json.loads(line)["prompt"] for line in lines][:args.prompts]
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(args.fx, "pycoder-18m"))
    ids = [tok(p, return_tensors="pt").input_ids[:, -256:].to(args.device) for p in prompts]
    torch.manual_seed(0)
    heads = {"P-EAGLE": sd.recipes.peagle(PEagleHead.from_target(target, num_layers=2, max_drafts=8)
                                          .to(args.device, torch.bfloat16).eval()),
             "DFlash": sd.recipes.dflash(DFlashHead.from_target(target, block_size=8, num_layers=2)
                                         .to(args.device, torch.bfloat16).eval())}
    if args.peagle:
        heads["P-EAGLE trained"] = sd.recipes.peagle(sd.formats.load_peagle_head(args.peagle, target,
                                                                                 dtype=torch.bfloat16))
    if args.dflash:
        heads["DFlash trained"] = sd.recipes.dflash(sd.formats.load_dflash_head(args.dflash, target,
                                                                                dtype=torch.bfloat16))
    res = {}
    for name, drafter in heads.items():
        def run(x, profile=False):
            return sd.generate(target, x, drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True,
                               profile=profile)
        for x in ids:
            run(x)
        sync()
        phases, steps, wall, pre = {}, 0, 0.0, 0.0
        for x in ids:
            s = run(x, profile=True).stats
            for k, v in (s.phase_times or {}).items():
                phases[k] = phases.get(k, 0.0) + v
            steps += s.num_steps
            t = time.perf_counter()
            out = run(x)
            sync()
            total = time.perf_counter() - t
            wall += out.stats.wall_time - out.stats.prefill_time
            pre += out.stats.prefill_time
            print(f"{name}: call {total * 1e3:.1f} ms, prefill {out.stats.prefill_time * 1e3:.2f} ms, "
                  f"steps {out.stats.num_steps}, tau {out.stats.tau:.2f}", flush=True)
        res[name] = {"phases_ms": {k: round(1e3 * v / steps, 4) for k, v in phases.items()},
                     "step_ms": 1e3 * wall / steps, "prefill_ms": 1e3 * pre / len(ids)}
        print(name, json.dumps(res[name]), flush=True)
        if args.peagle or args.dflash:
            continue
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if args.kernels else [])
        with torch.profiler.profile(activities=acts) as prof:
            run(ids[0])
            sync()
        sort = "self_device_time_total" if args.kernels else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=70), flush=True)
    if args.out:
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
