"""EAGLE-2 with a frequency-ranked draft vocabulary (FR-Spec): tau against the vocabulary's size, outputs checked.

For each size ``V'`` of ``--sizes`` the EAGLE-1 head is restricted to the ``V'`` most frequent token ids of a
training corpus (:meth:`specdec.heads.Eagle1Head.restrict_vocab`, :func:`specdec.training.build_draft_vocab`) and
EAGLE-2 decodes the held-out prompts greedily. Per size: tau (tokens per target forward), the share of the held-out
continuation's tokens the vocabulary covers, the draft vocabulary's ``lm_head`` bytes per draft level, and whether
every output equals plain greedy decoding (it must: verification is the target's).

Default: the embedded demo (``specdec.demo``: 4-layer target, EAGLE-1 head, 2,048-token vocabulary; frequencies
counted over ``--max-files`` training files of this Python's standard library, held-out files skipped); runs on
CPU in about a minute. ``--target`` / ``--eagle1`` take any HF target and EAGLE-1 head folder instead
(``specdec.formats.load_eagle_head``), with ``--corpus-dir`` for the frequencies and ``--prompts`` (jsonl with a
``prompt`` field) for the held-out prompts.

Writes ``results.json`` and ``tau_vs_vocab.png`` to ``--out`` and prints a table last.

Examples::

    python examples/ablate_draft_vocab.py --out runs/draft_vocab                              # the demo, CPU
    python examples/ablate_draft_vocab.py --target pycoder-18m --eagle1 runs/eagle1/final \\
        --corpus-dir <site-packages> --prompts pycode-heldout.jsonl --sizes 8192 4096 2048 1024 --device cuda
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specdec as sd  # noqa: E402
from specdec.demo.build import is_heldout, stdlib_files  # noqa: E402
from specdec.training import build_draft_vocab  # noqa: E402


def token_counts(tokenizer, files, vocab_size: int, max_files: int) -> torch.Tensor:
    """Occurrences of each token id over the first ``max_files`` files (held-out files skipped). Shape ``[V]``."""
    from tqdm.auto import tqdm

    counts = torch.zeros(vocab_size, dtype=torch.long)
    kept = [f for f in files if not is_heldout(Path(f).read_bytes())][:max_files]
    for path in tqdm(kept, desc="token counts"):
        ids = tokenizer(Path(path).read_bytes().decode("utf-8", errors="replace")).input_ids
        if ids:
            counts += torch.bincount(torch.tensor(ids).clamp(0, vocab_size - 1), minlength=vocab_size)
    return counts


def load(args):
    """``(target, tokenizer, head, prompts, files)`` of the demo or of ``--target`` / ``--eagle1``."""
    if args.target is None:
        from specdec.demo import load_demo_models

        demo = load_demo_models(device=args.device, dtype=torch.float32)
        prompts = [p.prompt for p in demo.heldout_prompts(args.num_prompts)]
        return demo.target, demo.tokenizer, demo.eagle_head, prompts, stdlib_files(args.corpus_dir)[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if args.device == "cuda" else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, attn_implementation="sdpa").to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    head = sd.formats.load_eagle_head(args.eagle1, target)
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()][:args.num_prompts]
    files = sorted(str(p) for p in Path(args.corpus_dir).rglob("*.py")) if args.corpus_dir else []
    random.Random(0).shuffle(files)  # --max-files spread over the whole tree, the same ones every run
    if not files:
        raise ValueError("--target needs --corpus-dir, a folder of .py files to count token frequencies over")
    return target, tokenizer, head, prompts, files


def run(args) -> dict:
    target, tokenizer, head, prompts, files = load(args)
    V = target.config.vocab_size
    counts = token_counts(tokenizer, files, V, args.max_files)
    tree = dict(total_tokens=args.total_tokens, depth=args.depth, top_k=args.top_k)
    encoded = [tokenizer(p, return_tensors="pt").input_ids[:, -args.prompt_tokens:].to(args.device) for p in prompts]
    fast = {"off": False, "graphs": True}.get(args.fast, args.fast)
    plain = [sd.generate(target, ids, max_new_tokens=args.max_new_tokens, eos_token_id=[], fast=fast).sequences
             for ids in encoded]
    continuation = torch.cat([s[0, ids.shape[1]:].cpu() for s, ids in zip(plain, encoded)])
    rows = []
    for size in [s for s in args.sizes if s <= V] or [V]:
        head.restrict_vocab(None if size >= V else build_draft_vocab(counts, size))
        kept = torch.zeros(V, dtype=torch.bool)
        kept[head.draft_to_target(torch.arange(size, device=head.lm_head_weight.device)).cpu()] = True
        drafter = sd.recipes.eagle2(head, **tree)
        emitted = forwards = same_tokens = 0
        same = True
        for ids, ref in zip(encoded, plain):
            out = sd.generate(target, ids, drafter=drafter, max_new_tokens=args.max_new_tokens, eos_token_id=[],
                              fast=fast)
            same &= torch.equal(out.sequences, ref)
            same_tokens += int((out.sequences[:, ids.shape[1]:] == ref[:, ids.shape[1]:]).sum())
            emitted += int(out.num_new_tokens.sum())
            forwards += out.stats.num_target_forwards
        rows.append(dict(size=size, tau=emitted / max(forwards, 1), coverage=float(kept[continuation].float().mean()),
                         lm_head_mb=size * head.config.hidden_size * head.lm_head_weight.element_size() / 1e6,
                         identical=bool(same), same_token_rate=same_tokens / max(emitted, 1)))
    head.restrict_vocab(None)
    # float32: greedy speculative output must equal plain greedy output (lossless); bfloat16: a 60-token verify
    # forward rounds differently from a one-token step, so a near-tie can flip and the sequences part (both are
    # the target's greedy choice under their own rounding)
    return dict(vocab_size=V, prompts=len(prompts), max_new_tokens=args.max_new_tokens, tree=tree,
                device=args.device, fast=args.fast, dtype=str(next(target.parameters()).dtype).split(".")[-1],
                rows=rows)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["size"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    ax.plot(sizes, [r["tau"] for r in result["rows"]], "o-", label="tau (EAGLE-2)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"draft vocabulary size (of {result['vocab_size']})")
    ax.set_ylabel("tau")
    twin = ax.twinx()
    twin.plot(sizes, [100 * r["coverage"] for r in result["rows"]], "s--", color="tab:orange",
              label="held-out tokens covered (%)")
    twin.set_ylabel("coverage %")
    lines = ax.get_lines() + twin.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="lower right", fontsize=8)
    ax.set_title(f"FR-Spec draft vocabulary: {result['prompts']} prompts, {result['max_new_tokens']} new tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="HF target folder (default: the embedded demo)")
    ap.add_argument("--eagle1", default=None, help="EAGLE-1 head folder (with --target)")
    ap.add_argument("--prompts", default=None, help="jsonl of prompts (with --target)")
    ap.add_argument("--corpus-dir", default=None, help="folder of .py files to count tokens over")
    ap.add_argument("--max-files", type=int, default=300)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 1024, 512, 256, 128])
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="keep each prompt's last this many tokens")
    ap.add_argument("--total-tokens", type=int, default=60)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="target dtype with --target (default: bfloat16 on CUDA, else float32); float32 makes the "
                         "'identical' column a lossless check (in bf16 near-ties flip)")
    ap.add_argument("--fast", default="off", choices=["off", "graphs", "compile"],
                    help="generate()'s fast path for every run (plain and speculative alike)")
    ap.add_argument("--out", default="runs/draft_vocab")
    args = ap.parse_args(argv)
    if args.target is not None and (args.eagle1 is None or args.prompts is None):
        ap.error("--target needs --eagle1 and --prompts")
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(args.out, "tau_vs_vocab.png"))
    print(f"{'size':>7} {'tau':>6} {'coverage':>9} {'lm_head MB':>11} identical  same tokens ({result['dtype']})")
    for r in result["rows"]:
        print(f"{r['size']:>7} {r['tau']:>6.2f} {100 * r['coverage']:>8.1f}% {r['lm_head_mb']:>11.2f} "
              f"{r['identical']!s:>9} {100 * r['same_token_rate']:>11.1f}%")
    return result


if __name__ == "__main__":
    main()
