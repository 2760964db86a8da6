"""Train a P-EAGLE head (parallel drafting: all K drafts in one forward) for a causal LM on Python sources.

Held-out split (the same rule as ``examples/train_eagle.py``, imported from it): a file is held out, and never
trained on, when the SHA-1 of its bytes read as a hexadecimal integer is divisible by 50. The validation batch
comes from held-out files (or, when there are none, from the end of the training stream).

Example (the fixture target on one GPU)::

    python examples/train_peagle.py --target PATH/TO/pycoder-18m --data-dir /path/to/python/src \\
        --steps 3000 --max-drafts 6 --out-dir runs/peagle --device cuda

    # on a CPU, in a minute, with the demo's shipped target:
    python examples/train_peagle.py --target specdec/demo/assets/target --time-budget 30 --steps 200 \\
        --batch-size 4 --seq-len 128 --max-files 50 --out-dir runs/peagle

Writes ``OUT/peagle/final`` (speculators ``peagle`` layout: ``specdec.formats.load_peagle_head``, vLLM
``parallel_drafting``) and ``OUT/summary.json`` (losses, per-depth accuracy on the validation batch, and greedy
tau / speed-up on held-out prompts when ``--eval-prompts`` is given).
"""
from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_eagle import collect_sources, evaluate, is_held_out  # noqa: E402  (the one held-out rule)


def held_out_texts(root: Path, limit: int) -> list[str]:
    """Up to ``limit`` held-out ``*.py`` files under ``root`` (:func:`is_held_out`), for validation only."""
    texts = []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if data.strip() and is_held_out(data):
            texts.append(data.decode("utf-8", errors="replace"))
            if len(texts) >= limit:
                break
    return texts


def validation_batch(tokenizer, held: list[str], train_ids: list[list[int]], rows: int, seq_len: int, device):
    """``rows`` windows of ``seq_len`` tokens: from held-out files, else from the end of the training stream."""
    from specdec.training import token_stream

    source = tokenizer(held, add_special_tokens=False)["input_ids"] if held else train_ids[-rows * 4:]
    stream = token_stream(source, separator=tokenizer.eos_token_id)
    n = min(rows, stream.numel() // seq_len)
    if n < 1:
        return None
    return stream[: n * seq_len].view(n, seq_len).to(device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF model path or hub id of the target")
    parser.add_argument("--data-dir", default=sysconfig.get_paths()["stdlib"],
                        help="directory of Python sources (default: this Python's standard library)")
    parser.add_argument("--out-dir", default="runs/peagle")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--time-budget", type=float, default=None, help="stop training after this many seconds")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--segment-len", type=int, default=None, help="real entries per head forward")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-drafts", type=int, default=4, help="K: drafts per forward (depths trained)")
    parser.add_argument("--num-layers", type=int, default=2, help="decoder layers of the head")
    parser.add_argument("--save-every", type=int, default=1000)
    parser.add_argument("--max-files", type=int, default=0, help="cap on training files (0: all)")
    parser.add_argument("--val-rows", type=int, default=8, help="windows in the validation batch")
    parser.add_argument("--eval-prompts", default=None, help="jsonl with a 'prompt' field (e.g. pycode-heldout)")
    parser.add_argument("--eval-n", type=int, default=20)
    parser.add_argument("--eval-new-tokens", type=int, default=128)
    parser.add_argument("--decay-gamma", type=float, default=None,
                        help="weight depth d by exp(-d / gamma) (default: uniform over depths)")
    parser.add_argument("--init", default=None,
                        help="continue training this P-EAGLE checkpoint (folder) instead of a fresh head")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.recipes import peagle
    from specdec.training import evaluate_peagle, train_peagle

    device = torch.device(args.device)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts, held = collect_sources(Path(args.data_dir), args.max_files or None, args.seed)
    if not texts:
        print(f"no training files under {args.data_dir}", file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]
    n_tokens = sum(len(t) for t in token_lists)
    print(f"{len(texts)} training files ({held} held out skipped), {n_tokens} tokens")
    dtype = torch.float32 if device.type == "cpu" else None  # bf16 matmuls are slow on a CPU
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()

    head = None
    if args.init:
        from specdec.formats import load_peagle_head

        head = load_peagle_head(args.init, target, device=device)
        print(f"continuing {args.init}: {head.num_levels} levels")
    t0 = time.time()
    result = train_peagle(target, token_lists, tokenizer=tokenizer, head=head, steps=args.steps, seq_len=args.seq_len,
                          batch_size=args.batch_size, lr=args.lr, max_drafts=args.max_drafts,
                          segment_len=args.segment_len, num_layers=args.num_layers, out_dir=out / "peagle",
                          save_every=args.save_every, seed=args.seed, time_budget=args.time_budget,
                          decay_gamma=args.decay_gamma)
    history = result.history
    if not history:
        print("no training step ran (time budget too small)", file=sys.stderr)
        return 1
    tail = history[-50:]
    summary = {"target": args.target, "train_files": len(texts), "held_out_files": held, "train_tokens": n_tokens,
               "args": vars(args), "train_seconds": time.time() - t0, "steps_done": len(history),
               "first_loss": history[0].loss, "final_loss": sum(r.loss for r in tail) / len(tail)}
    print(f"loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f} after {len(history)} steps "
          f"({summary['train_seconds']:.0f} s)")
    batch = validation_batch(tokenizer, held_out_texts(Path(args.data_dir), args.val_rows * 4),
                             token_lists, args.val_rows, args.seq_len, device)
    if batch is not None:
        scores = evaluate_peagle(target, result.head, batch)
        summary["validation"] = scores._asdict()
        print("validation per depth (level 1..K):")
        for d, (loss, acc) in enumerate(zip(scores.loss, scores.accuracy)):
            print(f"  level {d + 1}: loss {loss:.3f}  top-1 accuracy {acc:.3f}")
    if args.eval_prompts:
        prompts = [json.loads(line)["prompt"] for line in Path(args.eval_prompts).read_text().splitlines()
                   if line.strip()][: args.eval_n]
        summary["eval_peagle_chain"] = evaluate(target, tokenizer, peagle(result.head), prompts,
                                                args.eval_new_tokens, device)
        print("peagle chain", summary["eval_peagle_chain"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"saved {out / 'peagle' / 'final'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
