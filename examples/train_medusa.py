"""Train Medusa-1 or Medusa-2 heads for a causal LM on a directory of Python sources, then build the optimised tree.

Steps: (1) read the training files, skipping the held-out ones (SHA-1 of the bytes, as an integer, divisible by 50:
the split of the fixture's held-out prompts; ``is_held_out`` / ``collect_sources`` of examples/train_eagle.py);
(2) train (``--method medusa1``: heads on the frozen target; ``--method medusa2``: heads warmed up, then heads and a
LoRA-adapted copy of the target jointly, distilled from the original target); (3) calibrate: decode held-IN prompts
cut from the training files with the heads, counting per-depth / per-rank acceptance; (4) build the optimised tree
(Medusa's greedy) at the node budget of ``mc_sim_7b_63`` (63 nodes) unless ``--num-nodes``.

Example (the fixture target on one H200, about 2-3 minutes per method)::

    python examples/train_medusa.py --target PATH/TO/pycoder-18m --data-dir <site-packages> \\
        --max-files 5000 --method medusa1 --out-dir runs/medusa1 --device cuda
    python examples/train_medusa.py --target PATH/TO/pycoder-18m --data-dir <site-packages> \\
        --max-files 5000 --method medusa2 --medusa1 runs/medusa1/medusa --out-dir runs/medusa2 --device cuda

Writes to ``--out-dir``: ``medusa/`` (the heads, Medusa authors' layout: ``specdec.formats.load_medusa_head``),
for Medusa-2 ``target/`` (the fine-tuned target and tokenizer: a new target), ``tree.json`` (the optimised tree's
choices, the measured acceptance table, the model's tau of each tree) and ``summary.json``. ``--quick`` runs the
whole pipeline in seconds on a tiny model built from a config (the CPU smoke test).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_eagle import collect_sources  # noqa: E402

# --------------------------------------------------------------------------------------------------------
# --quick: a tiny model and a byte tokenizer (no download), shared with examples/medusa_ablation.py
# --------------------------------------------------------------------------------------------------------


class ByteTokenizer:
    """A byte-level tokenizer for the smoke tests: ids 0..255 are bytes, 256 is the end of text."""

    eos_token_id = 256
    pad_token_id = 256
    vocab_size = 257

    def __call__(self, texts, add_special_tokens: bool = False, return_tensors: str | None = None):
        """Tokenize a text or a list of texts (``return_tensors="pt"``: one ``[1, T]`` tensor for one text)."""
        single = isinstance(texts, str)
        ids = [list(t.encode("utf-8")) for t in ([texts] if single else texts)]
        if return_tensors == "pt":
            return _Batch(torch.tensor(ids, dtype=torch.long))
        return {"input_ids": ids[0] if single else ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Bytes back to text (the end-of-text id is dropped)."""
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def save_pretrained(self, folder) -> None:
        """Record what the tokenizer is (the smoke test reloads it by building it again)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "byte_tokenizer.json").write_text(json.dumps({"kind": "bytes", "eos_token_id": 256}))


class _Batch(dict):
    @property
    def input_ids(self):
        return self["input_ids"]

    def __init__(self, ids):
        super().__init__(input_ids=ids)


def tiny_target(seed: int = 0, hidden: int = 64, layers: int = 2):
    """A tiny random Llama over :class:`ByteTokenizer`'s vocabulary (float32, sdpa)."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=ByteTokenizer.vocab_size, hidden_size=hidden,
                                      intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=2048, eos_token_id=256, pad_token_id=256,
                                      bos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(seed)  # a smoke-test model only: its weights are not what the pipeline is judged on
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper laws, so drafts get accepted
    return model.eval()


# --------------------------------------------------------------------------------------------------------
# Calibration prompts: held-IN text cut from the training files
# --------------------------------------------------------------------------------------------------------


def calibration_prompts(token_lists: list, n: int, prompt_tokens: int, seed: int) -> list[torch.Tensor]:
    """``n`` prompts of ``prompt_tokens`` tokens at random offsets of random training files (never held-out ones).

    Args:
        token_lists: the training files' token ids.
        n: prompts wanted.
        prompt_tokens: tokens per prompt.
        seed: seeds the choice.

    Returns:
        ``[1, prompt_tokens]`` tensors (fewer than ``n`` if the files are too short).
    """
    rng = random.Random(seed)
    long_enough = [ids for ids in token_lists if len(ids) > prompt_tokens + 8]
    rng.shuffle(long_enough)
    out = []
    for ids in long_enough[:n]:
        start = rng.randrange(0, len(ids) - prompt_tokens - 8)
        out.append(torch.tensor(ids[start: start + prompt_tokens], dtype=torch.long)[None])
    return out


def build_tree(target, head, prompts, *, num_nodes: int, num_ranks: int, new_tokens: int, device,
               mode: str = "continuation") -> dict:
    """Measure the heads' per-depth / per-rank acceptance on ``prompts`` and build the optimised tree.

    Returns:
        A JSON-ready dict: ``choices`` (the optimised tree), ``sequoia_choices`` (the exact DP's), the acceptance
        table and its counts, and the model's tau of the optimised, ``mc_sim_7b_63`` and chain trees.
    """
    from specdec import recipes
    from specdec.trees import MEDUSA_MC_SIM_7B_63, chain_tree
    from specdec.trees.optimize import expected_accept_length, measure_rank_acceptance, optimal_tree, sequoia_tree

    depth = head.num_levels
    t0 = time.time()
    acc = measure_rank_acceptance(target, lambda t: recipes.medusa(head, t), [p.to(device) for p in prompts],
                                  num_levels=depth, num_ranks=num_ranks, max_new_tokens=new_tokens, eos_token_id=[],
                                  mode=mode, progress=True)
    tree = optimal_tree(acc, num_nodes)
    exact = sequoia_tree(acc, num_nodes)
    mc_sim = [p for p in MEDUSA_MC_SIM_7B_63 if len(p) <= depth]
    return {
        "num_nodes": num_nodes,
        "calibration_mode": mode,
        "choices": [list(p) for p in tree],
        "sequoia_choices": [list(p) for p in exact],
        "acceptance": acc.probs.tolist(),
        "hits": acc.hits.tolist(),
        "tries": acc.tries.tolist(),
        "calibration_steps": acc.num_steps,
        "calibration_prompts": len(prompts),
        "calibration_seconds": time.time() - t0,
        "model_tau": {"optimised": expected_accept_length(tree, acc), "sequoia": expected_accept_length(exact, acc),
                      "mc_sim_7b_63": expected_accept_length(mc_sim, acc),
                      "chain": expected_accept_length(chain_tree(depth), acc)},
    }


def kl_to_original(original, tuned, token_lists: list, seq_len: int, device, seed: int, windows: int = 8) -> float:
    """Mean ``KL(p_original || p_tuned)`` per token on held-in windows: how far Medusa-2 moved the target."""
    from specdec.training.medusa import distillation_kl

    batch = [p[0] for p in calibration_prompts(token_lists, windows, seq_len, seed)]
    if not batch:
        return float("nan")
    ids = torch.stack(batch).to(device)
    with torch.no_grad():
        return float(distillation_kl(original(input_ids=ids).logits, tuned(input_ids=ids).logits))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="HF model path or hub id of the target")
    parser.add_argument("--data-dir", default=None,
                        help="directory of Python sources (default: this Python's standard library; with --quick, "
                             "specdec's own sources)")
    parser.add_argument("--max-files", type=int, default=5000, help="cap on training files (0: all)")
    parser.add_argument("--method", choices=("medusa1", "medusa2"), default="medusa1")
    parser.add_argument("--out-dir", default="runs/medusa")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="target dtype (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--steps", type=int, default=1500, help="Medusa-1 steps, or Medusa-2 joint steps")
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="Medusa-2: heads-only warm-up steps (default: --steps without --medusa1, else 0)")
    parser.add_argument("--medusa1", default=None, help="Medusa-2: start from these Medusa-1 heads (a folder)")
    parser.add_argument("--num-heads", type=int, default=5)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3, help="heads' peak learning rate")
    parser.add_argument("--target-lr", type=float, default=2e-4, help="Medusa-2: the target's peak learning rate")
    parser.add_argument("--lora-rank", type=int, default=16, help="Medusa-2: LoRA rank (0: full fine-tune)")
    parser.add_argument("--lm-weight", type=float, default=1.0, help="Medusa-2: weight of the distillation KL")
    parser.add_argument("--heads-weight", type=float, default=0.2, help="Medusa-2: weight of the heads' loss")
    parser.add_argument("--labels", choices=("target", "data"), default="target",
                        help="head labels: the target's distributions (self-distillation) or the data's tokens")
    parser.add_argument("--save-every", type=int, default=0, help="checkpoint period (0: only the final heads)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds for the (joint) training loop")
    parser.add_argument("--calib-prompts", type=int, default=64, help="held-in calibration prompts")
    parser.add_argument("--calib-prompt-tokens", type=int, default=256)
    parser.add_argument("--calib-new-tokens", type=int, default=64)
    parser.add_argument("--num-nodes", type=int, default=None, help="tree budget (default: mc_sim_7b_63's, 63)")
    parser.add_argument("--num-ranks", type=int, default=10, help="ranks measured per depth (Medusa's TOPK)")
    parser.add_argument("--calib-mode", choices=("continuation", "prefix"), default="continuation",
                        help="acceptance against the target's continuation (Medusa's heads_accuracy) or given the "
                             "accepted prefix (see specdec.trees.optimize.measure_rank_acceptance)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="CPU smoke test: a tiny model from a config, seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.max_files = "cpu", args.max_files if args.max_files != 5000 else 12
        args.steps, args.batch_size, args.seq_len = min(args.steps, 12), 4, 64
        args.num_heads, args.calib_prompts, args.calib_prompt_tokens, args.calib_new_tokens = 3, 2, 24, 12
        args.num_ranks, args.warmup_steps = 4, args.warmup_steps if args.warmup_steps is not None else 4
    elif not args.target:
        parser.error("--target is required (or --quick)")
    if args.data_dir is None:
        args.data_dir = str(Path(__file__).resolve().parents[1] / "specdec") if args.quick else \
            sysconfig.get_paths()["stdlib"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.formats.medusa import load_medusa_head, save_medusa_head
    from specdec.training.medusa import train_medusa1, train_medusa2
    from specdec.trees import MEDUSA_MC_SIM_7B_63

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    texts, held = collect_sources(Path(args.data_dir), args.max_files or None, args.seed)
    if not texts:
        print(f"no training files under {args.data_dir}", file=sys.stderr)
        return 1
    if args.quick:
        tokenizer, target = ByteTokenizer(), tiny_target(args.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.target)
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, attn_implementation="sdpa")
    target = target.to(device=device, dtype=dtype).eval()
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]  # one batched call
    n_tokens = sum(len(t) for t in token_lists)
    print(f"{len(texts)} training files ({held} held out skipped), {n_tokens} tokens")
    common = dict(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, labels=args.labels,
                  save_every=args.save_every, out_dir=out / "checkpoints" if args.save_every else None, seed=args.seed,
                  time_budget=args.time_budget)
    summary = {"method": args.method, "target": args.target or "quick tiny Llama", "train_files": len(texts),
               "held_out_files_skipped": held, "train_tokens": n_tokens, "args": vars(args)}
    t0 = time.time()
    if args.method == "medusa1":
        result = train_medusa1(target, token_lists, num_heads=args.num_heads, num_layers=args.num_layers, lr=args.lr,
                               **common)
        head, history = result.head, result.history
    else:
        head = load_medusa_head(args.medusa1, target) if args.medusa1 else None
        result = train_medusa2(target, token_lists, head=head, num_heads=args.num_heads, num_layers=args.num_layers,
                               head_warmup_steps=args.warmup_steps, lr=args.target_lr, heads_lr=args.lr,
                               lora_rank=args.lora_rank, lm_weight=args.lm_weight, heads_weight=args.heads_weight,
                               **common)
        summary["kl_to_original"] = kl_to_original(target, result.target, token_lists, args.seq_len, device,
                                                   args.seed + 2)
        target, head, history = result.target, result.head, result.history
        target.save_pretrained(out / "target")
        tokenizer.save_pretrained(out / "target")
    summary["train_seconds"] = time.time() - t0
    save_medusa_head(head, out / "medusa", base_model_name_or_path=str(out / "target") if args.method == "medusa2"
              else args.target)
    tail = history[-50:]
    summary["final_loss"] = sum(r.loss for r in tail) / len(tail)
    summary["final_metrics"] = {k: sum(r.metrics[k] for r in tail if k in r.metrics)
                                / max(1, sum(k in r.metrics for r in tail)) for k in tail[-1].metrics}
    print({k: round(v, 4) for k, v in summary["final_metrics"].items()})

    prompts = calibration_prompts(token_lists, args.calib_prompts, args.calib_prompt_tokens, args.seed + 1)
    num_nodes = args.num_nodes or len(MEDUSA_MC_SIM_7B_63)
    tree = build_tree(target, head, prompts, num_nodes=num_nodes, num_ranks=args.num_ranks,
                      new_tokens=args.calib_new_tokens, device=device, mode=args.calib_mode)
    (out / "tree.json").write_text(json.dumps(tree, indent=1) + "\n")
    summary["tree"] = {k: tree[k] for k in ("num_nodes", "calibration_steps", "calibration_prompts", "model_tau")}
    summary["total_seconds"] = time.time() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["tree"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
