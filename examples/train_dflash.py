"""Train a DFlash or DSpark head for a causal LM on a directory of Python sources, then measure it.

Held-out split (``is_held_out`` of examples/train_eagle.py): a file is held out, and never trained on, when the
SHA-1 of its bytes read as a hexadecimal integer is divisible by 50. Held-out files give the validation batch.

Example (the fixture target on one GPU)::

    python examples/train_dflash.py --method dflash --target PATH/TO/pycoder-18m --data-dir /path/to/src \\
        --steps 3000 --block-size 8 --out-dir runs/dflash --device cuda

    python examples/train_dflash.py --method dspark --target specdec/demo/assets/target --time-budget 60

Writes ``OUT/<method>/final`` (speculators layout, ``specdec.formats.load_dflash_head``; for DFlash also
``OUT/dflash-zlab``, z-lab's layout) and ``OUT/<method>/summary.json``: losses, per-level top-1 agreement with
the target on a validation batch, and greedy tau / speed-up on held-out prompts when ``--eval-prompts`` is given.
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

from train_eagle import evaluate, is_held_out  # noqa: E402


def collect(root: Path, max_files: int | None) -> tuple[list[str], list[str]]:
    """Read ``*.py`` files under ``root``: (training texts, held-out texts)."""
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if not data.strip():
            continue
        (held if is_held_out(data) else train).append(data.decode("utf-8", errors="replace"))
        if max_files and len(train) >= max_files:
            break
    return train, held


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="dflash", choices=("dflash", "dspark"))
    parser.add_argument("--target", required=True, help="HF model path or hub id of the target")
    parser.add_argument("--data-dir", default=sysconfig.get_paths()["stdlib"],
                        help="directory of Python sources (default: this Python's standard library)")
    parser.add_argument("--out-dir", default="runs/dflash")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--time-budget", type=float, default=None, help="wall-clock seconds of training")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--anchors", type=int, default=32, help="blocks per window")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save-every", type=int, default=1000)
    parser.add_argument("--max-files", type=int, default=0, help="cap on training files (0: all)")
    parser.add_argument("--eval-prompts", default=None, help="jsonl with a 'prompt' field (e.g. pycode-heldout)")
    parser.add_argument("--eval-n", type=int, default=20)
    parser.add_argument("--eval-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.formats import export_dflash_zlab
    from specdec.recipes import dflash, dspark
    from specdec.training import block_accuracy, token_stream, train_dflash

    device = torch.device(args.device)
    out = Path(args.out_dir)
    texts, held = collect(Path(args.data_dir), args.max_files or None)
    if not texts:
        print(f"no training files under {args.data_dir}", file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]
    print(f"{len(texts)} training files ({len(held)} held out), {sum(len(t) for t in token_lists)} tokens")
    target = AutoModelForCausalLM.from_pretrained(args.target).to(device).eval()
    t0 = time.time()
    result = train_dflash(target, token_lists, method=args.method, steps=args.steps, batch_size=args.batch_size,
                          seq_len=args.seq_len, anchors_per_seq=args.anchors, block_size=args.block_size,
                          num_layers=args.num_layers, lr=args.lr, out_dir=out / args.method,
                          save_every=args.save_every, verifier_name_or_path=args.target, seed=args.seed,
                          time_budget=args.time_budget)
    head = result.head
    tail = result.history[-20:]
    summary = {"method": args.method, "target": args.target, "train_files": len(texts), "held_out_files": len(held),
               "steps": len(result.history), "train_seconds": time.time() - t0, "args": vars(args),
               "first_loss": result.history[0].loss if result.history else None,
               "final_loss": sum(r.loss for r in tail) / max(len(tail), 1)}
    for r in result.history[:: max(len(result.history) // 5, 1)]:
        print(f"step {r.step:5d}  loss {r.loss:.3f}  token {r.token_loss:.3f}  conf {r.confidence_loss:.3f}  "
              f"acc@1 {r.accuracy:.3f}  block acc {r.block_accuracy:.3f}")
    val_stream = token_stream(tokenizer(held or texts[-1:], add_special_tokens=False)["input_ids"],
                              separator=tokenizer.eos_token_id)
    window = min(args.seq_len, val_stream.numel())
    rows = max(1, min(8, val_stream.numel() // window))
    val = val_stream[: rows * window].view(rows, window).to(device)
    levels = block_accuracy(head, target, val, num_anchors=args.anchors).tolist()
    summary["validation_level_accuracy"] = levels
    print("validation top-1 agreement per level:", " ".join(f"{a:.3f}" for a in levels))
    if args.method == "dflash":
        export_dflash_zlab(head, out / "dflash-zlab", num_target_layers=target.config.num_hidden_layers)
    if args.eval_prompts:
        prompts = [json.loads(line)["prompt"] for line in Path(args.eval_prompts).read_text().splitlines()
                   if line.strip()][: args.eval_n]
        drafter = dflash(head) if args.method == "dflash" else dspark(head)
        summary["eval"] = evaluate(target, tokenizer, drafter, prompts, args.eval_new_tokens, device)
        print("eval", summary["eval"])
    (out / args.method / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
