"""Session 46: session 45's tau measurement (``docs/results/fast_s45/scripts/int4_tau.py``: an EAGLE-1 head of the
fixture, EAGLE-2, greedy, batch 1, held-out prompts) through the library's 4-bit heads (``specdec.nn.quantize_int4_``:
the rows rounded to float8 as well, which session 45's simulation did not do), at 128, 64 and 32 inputs per scale,
beside the float8 head.

    python docs/results/fast_s46/scripts/int4_tau_lib.py HEAD_DIR TARGET_DIR PROMPTS.jsonl [N] [NEW_TOKENS]
"""
from __future__ import annotations

import copy
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.formats import load_eagle_head
from specdec.generate import generate
from specdec.nn import quantize_fp8_, quantize_int4_
from specdec.recipes import eagle2


def main() -> None:
    head_dir, target_dir, prompts_path = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    new = int(sys.argv[5]) if len(sys.argv) > 5 else 96
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    head = load_eagle_head(head_dir, target).eval().requires_grad_(False)
    prompts = [json.loads(line)["prompt"] for line in open(prompts_path) if line.strip()][:n]
    heads = {"as trained": head, "float8": quantize_fp8_(copy.deepcopy(head))}
    for g in (128, 64, 32):
        heads[f"4-bit, {g} per scale"] = quantize_int4_(copy.deepcopy(head), group=g)
    plain = {}
    out = {}
    for name, h in heads.items():
        emitted = steps = same = 0
        for i, text in enumerate(prompts):
            ids = tok(text, return_tensors="pt").input_ids[:, -256:]
            if i not in plain:
                plain[i] = generate(target, ids, max_new_tokens=new, eos_token_id=tok.eos_token_id).sequences
            run = generate(target, ids, drafter=eagle2(h), max_new_tokens=new, eos_token_id=tok.eos_token_id)
            emitted += run.stats.tau * run.stats.num_steps
            steps += run.stats.num_steps
            same += int(torch.equal(run.sequences, plain[i]))
        out[name] = {"tau": emitted / steps, "greedy_equal": f"{same}/{len(prompts)}"}
        print(f"{name:24s} tau {emitted / steps:.3f}  equal to plain decoding {same}/{len(prompts)}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
