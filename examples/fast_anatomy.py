"""Where the fast path's time goes on the fixture: capture / compile cost, replay time, host time, phases.

For each ``generate(fast=...)`` mode in ``--modes`` (``graphs`` = ``fast=True``, ``compile`` = ``fast="compile"``):

- **plain**: seconds of the first call (captures, and compiling for ``compile``), then ms per token of
  ``generate`` (batch 1, ``--max-new-tokens``, no EOS stop), against back-to-back replays of the captured plain
  forward alone (the host queues them ahead: GPU time); their difference is the host work the GPU waits for;
- **EAGLE-3** (``--eagle3`` head folder) and **SpS** (``--draft`` model, ``--draft-k``): first-call seconds, then
  ms per step, tau and tokens/s after an untimed pass over the prompts.

Then (``--phases``) fast EAGLE-3's per-step phases (``profile=True``) with the Triton kernels and with their torch
references forced (``specdec.kernels.kernel_mode("torch")``), in the same process: issue 12's before / after of
verify + commit + update. With ``--gptfast DIR`` also gpt-fast vanilla on the same prompts (compiled as the anchor
compiles it), for the ratio. Every part is timed with a wall-clock stamp and written to ``--out``/anatomy.json as
soon as it is done, so a run cut short keeps what it measured.

Example (H200)::

    python examples/fast_anatomy.py --target pycoder-18m --data pycode-heldout.jsonl --eagle3 heads/e3 \\
        --modes graphs compile --phases --gptfast anchors --out runs/anatomy
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import bench_fast  # noqa: E402

import specdec as sd  # noqa: E402
from specdec.drafters import DraftModelDrafter  # noqa: E402
from specdec.static import _STORES, capacity_for, fast_mode, use_fused  # noqa: E402


def _per_token(run, prompts) -> tuple[float, float, float]:
    """(ms per step, tau, tokens/s) of ``run`` (a :func:`bench_fast.specdec_run`) over ``prompts``, after an
    untimed pass over them (graphs of shapes met only in later prompts are captured there)."""
    for ids in prompts:
        run(ids)
    steps = tokens = 0
    wall = 0.0
    for ids in prompts:
        out = run(ids)
        s = run.last_stats
        steps += s.num_steps
        tokens += sum(len(t) for t in out.tokens)
        wall += s.wall_time - s.prefill_time
    return 1e3 * wall / steps, tokens / steps, tokens / wall


def replay_ms(target, mode: str, reps: int = 300) -> float:
    """ms per replay of the captured plain forward of ``target`` (``mode``'s store), replays queued back to back."""
    store = next(st for key, st in _STORES[target].items() if key[0] == () and key[2] == mode)
    runner = store.buffers.plain.runner
    for _ in range(10):
        runner._run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        runner._run()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / reps


def measure_mode(args, mode: str, dec: str, target, head, draft, prompts, done) -> None:
    """The plain, EAGLE-3 and SpS parts of one ``generate(fast=...)`` mode with one target decoder."""
    fast, n = fast_mode(True if mode == "graphs" else mode), args.max_new_tokens
    tag = mode if dec == "fused" else f"{mode}, HF modules"
    run = bench_fast.specdec_run(target, None, n, fast=fast)
    t0 = time.perf_counter()
    run(prompts[0])
    first = time.perf_counter() - t0
    ms, _, tps = _per_token(run, prompts)
    rep = replay_ms(target, fast)
    done({"part": f"plain ({tag})", "first_call_s": first, "ms_per_token": ms, "tokens_per_s": tps,
          "replay_only_ms": rep, "host_wait_ms": ms - rep})
    spec = {}
    if head is not None:
        spec["EAGLE-3"] = sd.recipes.eagle3(head)
    if draft is not None:
        spec[f"SpS K={args.draft_k}"] = DraftModelDrafter(draft, num_drafts=args.draft_k, fast=fast,
                                                          capacity=capacity_for(args.prompt_tokens, n, 16))
    for label, drafter in spec.items():
        try:
            run = bench_fast.specdec_run(target, drafter, n, fast=fast)
            t0 = time.perf_counter()
            run(prompts[0])
            first = time.perf_counter() - t0
            ms, tau, tps = _per_token(run, prompts)
            done({"part": f"{label} ({tag})", "first_call_s": first, "ms_per_step": ms, "tau": tau,
                  "tokens_per_s": tps})
        except Exception as err:  # recorded; the other parts still run
            traceback.print_exc()
            done({"part": f"{label} ({tag})", "error": f"{type(err).__name__}: {str(err)[:300]}"})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_fast.add_fixture_args(ap, num_prompts=4)
    ap.add_argument("--draft", default=None, help="draft model folder (SpS rows)")
    ap.add_argument("--draft-k", type=int, default=6)
    ap.add_argument("--modes", nargs="+", default=["graphs", "compile"], choices=["graphs", "compile"])
    ap.add_argument("--decoders", nargs="+", default=["fused"], choices=["fused", "hf"],
                    help="the target's forward on the fast path: the fused decoder and/or HF's modules")
    ap.add_argument("--hf-modes", nargs="+", default=None, choices=["graphs", "compile"],
                    help="modes for --decoders hf (default: --modes)")
    ap.add_argument("--phases", action="store_true", help="EAGLE-3 phases with kernels vs torch references")
    ap.add_argument("--out", default="runs/anatomy")
    args = ap.parse_args(argv)
    import transformers

    torch.backends.cuda.enable_cudnn_sdp(False)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "parts": []}

    def done(part: dict) -> None:
        part["at_s"] = round(time.perf_counter() - t_start, 1)
        report["parts"].append(part)
        print(json.dumps(part), flush=True)
        with open(os.path.join(args.out, "anatomy.json"), "w") as f:
            json.dump(report, f, indent=1)

    dtype, n = torch.bfloat16, args.max_new_tokens
    target = transformers.AutoModelForCausalLM.from_pretrained(
        args.target, dtype=dtype, attn_implementation="sdpa").cuda().eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.target)
    prompts = bench_fast.load_prompts(args.data, tokenizer, args.num_prompts, args.prompt_tokens, "cuda")
    report["prompts"] = len(prompts)
    head = sd.formats.load_eagle_head(args.eagle3, target, dtype=dtype, device="cuda") if args.eagle3 else None
    draft = (transformers.AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype, attn_implementation="sdpa")
             .cuda().eval() if args.draft else None)

    plan = [(dec, mode) for dec in args.decoders
            for mode in (args.hf_modes or args.modes if dec == "hf" else args.modes)]
    for dec, mode in plan:
        with use_fused(dec == "fused"):
            measure_mode(args, mode, dec, target, head, draft, prompts, done)

    if args.gptfast:  # last: importing gpt-fast sets inductor options process-wide
        runs = bench_fast.gptfast_methods(args.gptfast, target, draft, [args.draft_k] if draft is not None else [],
                                          n, "cuda", dtype)
        for label, run in runs.items():
            t0 = time.perf_counter()
            run(prompts[0])
            first = time.perf_counter() - t0
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs = [run(ids) for ids in prompts]
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            tokens = sum(len(o.tokens[0]) for o in outs)
            tau = sum(o.emitted for o in outs) / sum(o.steps for o in outs)
            done({"part": label, "first_call_s": first, "tokens_per_s": tokens / wall,
                  "ms_per_token": 1e3 * wall / tokens, "tau": tau})

    if args.phases and head is not None:
        drafter = sd.recipes.eagle3(head)
        for kmode in ("auto", "torch"):
            with sd.kernels.kernel_mode(kmode):
                phases = bench_fast.eagle3_phases(drafter, target, prompts[:2], n)
            p = phases["phases_ms_per_step"]
            done({"part": f"EAGLE-3 phases ({'kernels' if kmode == 'auto' else 'torch references'})", **phases,
                  "verify_commit_update_ms": sum(p.get(k, 0.0) for k in ("verify", "commit", "update"))})

    print(f"\n{'part':<40} {'first s':>8} {'ms/tok or step':>15} {'tok/s':>9} {'replay ms':>10}")
    for p in report["parts"]:
        ms = p.get("ms_per_token", p.get("ms_per_step", p.get("unprofiled_ms_per_step")))
        print(f"{p['part']:<40} {p.get('first_call_s', float('nan')):>8.1f} {ms or float('nan'):>15.3f} "
              f"{p.get('tokens_per_s', float('nan')):>9.1f} {p.get('replay_only_ms', float('nan')):>10.3f}")
    return report


if __name__ == "__main__":
    main()
