"""Session 45: what 4-bit head weights cost in acceptance. An EAGLE-1 head for the fixture target (pycoder-18m),
EAGLE-2 drafting (``recipes.eagle2``'s defaults), greedy, batch 1, on held-out prompts: tau with the head's
weights as trained, rounded to float8 (``specdec.nn.quantize_fp8_``: the rows rounded too), and rounded to 4-bit
codes with one scale per 128 inputs (round to nearest, ``int4_head.pack_int4``; simulated: the weights replaced by
the values the codes stand for, in the head's dtype).

    python docs/results/fast_s45/scripts/int4_tau.py HEAD_DIR TARGET_DIR PROMPTS.jsonl [N] [NEW_TOKENS]
"""
from __future__ import annotations

import copy
import json
import os
import sys

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(__file__))
from int4_head import pack_int4, unpack_int4  # noqa: E402

from specdec.formats import load_eagle_head  # noqa: E402
from specdec.generate import generate  # noqa: E402
from specdec.nn import quantize_fp8_  # noqa: E402
from specdec.recipes import eagle2  # noqa: E402


def mse_rounding(wp: torch.Tensor, group: int) -> torch.Tensor:
    """``wp``'s 4-bit rounding with each group's scale chosen from ``amax / 7`` times 1.0, 0.95, ..., 0.6 to
    minimise the group's squared error (the largest entries clipped), as a float tensor of ``wp``'s shape."""
    g = wp.view(wp.shape[0], -1, group)
    top = g.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7
    best, err = None, None
    for ratio in [1.0 - 0.05 * i for i in range(9)]:
        s = top * ratio
        q = torch.round(g / s).clamp(-7, 7) * s
        e = (q - g).pow(2).sum(-1, keepdim=True)
        best = q if best is None else torch.where(e < err, q, best)
        err = e if err is None else torch.minimum(e, err)
    return best.view_as(wp)


def int4_weights_(head: nn.Module, group: int = 128, mse: bool = False) -> nn.Module:
    """Every ``nn.Linear`` weight of ``head`` replaced by its 4-bit rounding, one scale per ``group`` inputs (inputs
    zero-padded to a multiple of 256 for the packing, the padding dropped again), in place; ``mse``: each group's
    scale chosen by :func:`mse_rounding`."""
    with torch.no_grad():
        for mod in head.modules():
            if type(mod) is nn.Linear:
                w = mod.weight.float()
                k = w.shape[1]
                wp = torch.nn.functional.pad(w, (0, -k % 256))
                if mse:
                    wq = mse_rounding(wp, group)
                elif group == 128:
                    wq = unpack_int4(*pack_int4(wp))
                else:  # the same rounding with smaller groups (simulated only)
                    g = wp.view(wp.shape[0], -1, group)
                    s = (g.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-12)
                    wq = (torch.round(g / s).clamp(-7, 7) * s).view_as(wp)
                mod.weight.copy_(wq[:, :k].to(mod.weight.dtype))
    return head


def main() -> None:
    head_dir, target_dir, prompts_path = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    new = int(sys.argv[5]) if len(sys.argv) > 5 else 96
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = load_eagle_head(head_dir, target).eval().requires_grad_(False)
    prompts = [json.loads(line)["prompt"] for line in open(prompts_path) if line.strip()][:n]
    groups = [int(g) for g in os.environ.get("INT4_GROUPS", "128").split(",") if g]
    heads = {"as trained": head, "float8 (weights and rows)": quantize_fp8_(copy.deepcopy(head))}
    if os.environ.get("ONLY_INT4"):
        heads = {}
    for g in groups:
        heads[f"4-bit weights, {g} per scale"] = int4_weights_(copy.deepcopy(head), g)
    for g in [int(g) for g in os.environ.get("INT4_MSE_GROUPS", "").split(",") if g]:
        heads[f"4-bit weights, {g} per scale, MSE scales"] = int4_weights_(copy.deepcopy(head), g, mse=True)
    out = {}
    for name, h in heads.items():
        emitted = steps = same = 0
        for text in prompts:
            ids = tok(text, return_tensors="pt").input_ids[:, -256:]
            plain = generate(target, ids, max_new_tokens=new, eos_token_id=tok.eos_token_id)
            run = generate(target, ids, drafter=eagle2(h), max_new_tokens=new, eos_token_id=tok.eos_token_id)
            emitted += run.stats.tau * run.stats.num_steps
            steps += run.stats.num_steps
            same += int(torch.equal(run.sequences, plain.sequences))
        out[name] = {"tau": emitted / steps, "greedy_equal": f"{same}/{len(prompts)}"}
        print(f"{name:32s} tau {emitted / steps:.3f}  outputs equal to plain decoding {same}/{len(prompts)}",
              flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
