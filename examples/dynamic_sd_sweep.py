"""Measure speedup against batch size for several K and derive a Dynamic SD schedule from it.

Speculative decoding pays off while the target is launch- or memory-bound; as the batch grows, verifying
B * (K + 1) tokens costs more and the best K falls (Dynamic Speculative Decoding as vLLM configures it:
``num_speculative_tokens_per_batch_size``).
This script measures greedy tokens/s of ``specdec.generate`` for each (batch size, K), plots speedup over plain
decoding against batch size, prints the best-K schedule in the ``[[start_bs, end_bs, K], ...]`` format, and
checks it by decoding with ``schedule=``.

Examples::

    python examples/dynamic_sd_sweep.py                       # the demo's models, CPU, no download
    python examples/dynamic_sd_sweep.py --target PATH/TO/pycoder-18m \
        --draft PATH/TO/pycoder-draft-4m --data PATH/TO/pycode-heldout.jsonl --device cuda
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specdec as sd  # noqa: E402
from specdec import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="HF model path (default: the demo target)")
    ap.add_argument("--draft", help="HF draft model path (default: the demo draft)")
    ap.add_argument("--data", help="JSONL with a 'prompt' field (default: the demo's held-out prompts)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--drafter", choices=["draft_model", "prompt_lookup"], default="draft_model")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per cell; the fastest is kept")
    ap.add_argument("--out", default="runs/dynamic_sd")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.device == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    n_prompts = max(args.batch_sizes)
    if args.target:
        load = dict(dtype=dtype, attn_implementation="sdpa")
        tok = transformers.AutoTokenizer.from_pretrained(args.target)
        target = transformers.AutoModelForCausalLM.from_pretrained(args.target, **load).to(args.device).eval()
        draft = transformers.AutoModelForCausalLM.from_pretrained(args.draft, **load).to(args.device).eval()
        prompts = bench.load_prompts(args.data, tok, n_prompts, args.prompt_tokens)
    else:
        from specdec.demo import load_demo_models

        demo = load_demo_models()
        target, draft, tok = demo.target.to(args.device, dtype), demo.draft.to(args.device, dtype), demo.tokenizer
        prompts = [tok(p.prompt, return_tensors="pt", add_special_tokens=False).input_ids
                   for p in demo.heldout_prompts(n_prompts, args.prompt_tokens)]
    prompts = [p.to(args.device) for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def make_drafter(k):
        if args.drafter == "prompt_lookup":
            return sd.PromptLookupDrafter(num_drafts=k)
        return sd.DraftModelDrafter(draft, num_drafts=k)

    throughput = bench.sweep_batch_and_k(target, make_drafter, prompts, batch_sizes=args.batch_sizes, ks=args.ks,
                                         max_new_tokens=args.max_new_tokens, pad_token_id=pad, repeats=args.repeats)
    schedule = bench.best_schedule(throughput)
    title = (f"{args.drafter}, {os.path.basename((args.target or 'demo target').rstrip('/'))}, "
             f"{str(dtype).split('.')[-1]}, {args.device}, greedy, {args.max_new_tokens} new tokens")
    lines = [f"### tokens/s by batch size and K ({title})", "",
             "| batch | " + " | ".join(f"K={k}" for k in args.ks) + " | best K |",
             "|---:|" + "---:|" * (len(args.ks) + 1)]
    for b in sorted(throughput):
        row = throughput[b]
        best = max(row, key=lambda k: (row[k], -k))
        lines.append(f"| {b} | " + " | ".join(f"{row[k]:.0f} ({row[k] / row[0]:.2f}x)" for k in args.ks)
                     + f" | {best} |")
    lines += ["", f"schedule (num_speculative_tokens_per_batch_size): {schedule}"]
    # Check the schedule end to end: decoding with it equals plain greedy decoding at the largest batch.
    b = max(args.batch_sizes)
    ids, mask = bench.left_pad([prompts[i % len(prompts)][0] for i in range(b)], pad)
    kmax = max(args.ks)
    out = sd.generate(target, ids, attention_mask=mask, drafter=make_drafter(kmax),
                      schedule=schedule, max_new_tokens=args.max_new_tokens, eos_token_id=[])
    plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, eos_token_id=[])
    lines.append(f"decoding batch {b} with that schedule: tau {out.stats.tau:.2f}, "
                 f"identical to plain greedy: {torch.equal(out.sequences, plain.sequences)}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump({"title": title, "throughput": {str(b): {str(k): v for k, v in row.items()}
                                                  for b, row in throughput.items()}, "schedule": schedule}, f, indent=1)
    try:
        bench.plot_sweep(throughput, os.path.join(args.out, "sweep.png"), title)
    except ImportError as e:  # matplotlib is optional (the `plot` extra)
        print(f"no plot: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
