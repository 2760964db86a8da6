"""Train EAGLE-1 and/or EAGLE-3 heads for a causal LM on a directory of Python sources, then measure them.

Held-out split (the demo's, ``specdec.demo.build.is_heldout``): a file is held out, and never trained on, when
the SHA-1 of its bytes read as a hexadecimal integer is divisible by 50.

Example (the fixture target on one GPU, a few minutes per head)::

    python examples/train_eagle.py --target PATH/TO/pycoder-18m --data-dir /path/to/python/src \\
        --steps 3000 --out-dir runs/eagle --device cuda

Writes ``OUT/eagle1/final`` and ``OUT/eagle3/final`` (EAGLE authors' format, ``specdec.formats.load_eagle_head``),
``OUT/eagle3-speculators`` (vLLM), and ``OUT/summary.json`` (losses, and tau / speed-up on held-out prompts when
``--eval-prompts`` is given).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def is_held_out(data: bytes) -> bool:
    """True when the file belongs to the held-out split (SHA-1 of its bytes, as an integer, divisible by 50)."""
    return int(hashlib.sha1(data).hexdigest(), 16) % 50 == 0


def collect_sources(root: Path, max_files: int | None, seed: int = 0) -> tuple[list[str], int]:
    """Read ``*.py`` files under ``root``, skipping held-out ones; returns (texts, number held out).

    With ``max_files``, the files are a seeded random sample (not the alphabetically first packages).
    """
    import random

    texts, held = [], 0
    paths = sorted(root.rglob("*.py"))
    if max_files:
        random.Random(seed).shuffle(paths)
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not data.strip():
            continue
        if is_held_out(data):
            held += 1
            continue
        texts.append(data.decode("utf-8", errors="replace"))
        if max_files and len(texts) >= max_files:
            break
    return texts, held


def evaluate(target, tokenizer, drafter, prompts: list[str], max_new_tokens: int, device) -> dict:
    """Greedy tau and speed-up of ``drafter`` against plain decoding, batch 1, on the given prompts."""
    from specdec.generate import generate

    eos = tokenizer.eos_token_id
    totals = {"plain": 0.0, "spec": 0.0, "tokens": 0, "emitted": 0.0, "forwards": 0, "match": 0}
    for i, text in enumerate(prompts):
        ids = tokenizer(text, return_tensors="pt").input_ids[:, -512:].to(device)
        runs = {}
        for name, d in (("plain", None), ("spec", drafter)):
            if i == 0:  # warm-up
                generate(target, ids, drafter=d, max_new_tokens=8, eos_token_id=eos)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            runs[name] = generate(target, ids, drafter=d, max_new_tokens=max_new_tokens, eos_token_id=eos)
            if device.type == "cuda":
                torch.cuda.synchronize()
            totals[name] += time.perf_counter() - t0
        spec = runs["spec"].stats
        totals["tokens"] += spec.num_new_tokens
        totals["emitted"] += spec.tau * spec.num_steps
        totals["forwards"] += spec.num_steps
        totals["match"] += int(torch.equal(runs["spec"].sequences, runs["plain"].sequences))
    return {"tau": totals["emitted"] / max(totals["forwards"], 1),
            "speedup": totals["plain"] / max(totals["spec"], 1e-9),
            "plain_tok_s": totals["tokens"] / max(totals["plain"], 1e-9),
            "spec_tok_s": totals["tokens"] / max(totals["spec"], 1e-9),
            "greedy_match_rate": totals["match"] / max(len(prompts), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF model path or hub id of the target")
    parser.add_argument("--data-dir", default=sysconfig.get_paths()["stdlib"],
                        help="directory of Python sources (default: this Python's standard library)")
    parser.add_argument("--out-dir", default="runs/eagle")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--methods", default="eagle1,eagle3", help="comma list of eagle1, eagle3")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ttt-steps", type=int, default=7, help="EAGLE-3 unrolled steps")
    parser.add_argument("--draft-vocab-size", type=int, default=4096, help="EAGLE-3 reduced vocabulary (0: full)")
    parser.add_argument("--draft-vocab-coverage", type=float, default=None,
                        help="EAGLE-3: size the reduced vocabulary to cover this fraction of the training tokens "
                             "(overrides --draft-vocab-size)")
    parser.add_argument("--save-every", type=int, default=1000)
    parser.add_argument("--max-files", type=int, default=0, help="cap on training files (0: all)")
    parser.add_argument("--eval-prompts", default=None, help="jsonl with a 'prompt' field (e.g. pycode-heldout)")
    parser.add_argument("--eval-n", type=int, default=20)
    parser.add_argument("--eval-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.formats import export_speculators
    from specdec.recipes import eagle1, eagle2, eagle3
    from specdec.training import train_eagle1, train_eagle3

    device = torch.device(args.device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts, held = collect_sources(Path(args.data_dir), args.max_files or None, args.seed)
    if not texts:
        print(f"no training files under {args.data_dir}", file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]  # one batched (Rust) call
    n_tokens = sum(len(t) for t in token_lists)
    print(f"{len(texts)} training files ({held} held out skipped), {n_tokens} tokens")
    target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
    common = dict(tokenizer=tokenizer, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                  save_every=args.save_every, seed=args.seed)
    summary = {"target": args.target, "train_files": len(texts), "held_out_files": held, "train_tokens": n_tokens,
               "args": vars(args)}
    heads = {}
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        t0 = time.time()
        if method == "eagle1":
            result = train_eagle1(target, token_lists, out_dir=out / "eagle1", **common)
        elif method == "eagle3":
            result = train_eagle3(target, token_lists, out_dir=out / "eagle3", ttt_steps=args.ttt_steps,
                                  draft_vocab_size=(None if args.draft_vocab_coverage
                                                    else (args.draft_vocab_size or None)),
                                  draft_vocab_coverage=args.draft_vocab_coverage, **common)
            export_speculators(result.head, out / "eagle3-speculators", args.target)
        else:
            print(f"unknown method {method!r} (use eagle1, eagle3)", file=sys.stderr)
            return 1
        tail = result.history[-50:]
        summary[method] = {"train_seconds": time.time() - t0, "draft_vocab_size": result.head.config.draft_vocab,
                           "final_loss": sum(r.loss for r in tail) / len(tail),
                           "final_top1_accuracy": sum(r.accuracy for r in tail) / len(tail)}
        print(method, summary[method])
        heads[method] = result.head

    if args.eval_prompts:
        prompts = [json.loads(line)["prompt"] for line in Path(args.eval_prompts).read_text().splitlines()
                   if line.strip()][: args.eval_n]
        recipes = {}
        if "eagle1" in heads:
            recipes["eagle1_static"] = eagle1(heads["eagle1"])
            recipes["eagle2_dynamic"] = eagle2(heads["eagle1"])
        if "eagle3" in heads:
            recipes["eagle3_dynamic"] = eagle3(heads["eagle3"])
        for name, drafter in recipes.items():
            summary[f"eval_{name}"] = evaluate(target, tokenizer, drafter, prompts, args.eval_new_tokens, device)
            print(name, summary[f"eval_{name}"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
