"""The demo in a page of code: the shipped small models, plain greedy decoding against EAGLE-2, on CPU.

    python examples/demo.py                  # one held-out prompt, 64 new tokens
    python -m specdec.demo                   # the full table (plain, draft model, prompt lookup, EAGLE-2)

``load_demo_models`` gives a 4-layer Llama target trained on Python's standard library, a distilled 1-layer
draft, an EAGLE-1 head trained against the target, the tokenizer and held-out prompts; nothing is downloaded.
"""
import sys
from pathlib import Path

import torch

try:
    import specdec as sd
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import specdec as sd

from specdec.demo import load_demo_models


def main() -> int:
    torch.set_num_threads(1)
    demo = load_demo_models()                       # float32 on CPU: where greedy identity is guaranteed
    prompt = demo.heldout_prompts(1, prompt_tokens=256)[0]
    ids = demo.tokenizer(prompt.prompt, return_tensors="pt", add_special_tokens=False).input_ids

    plain = sd.generate(demo.target, ids, max_new_tokens=64)
    drafter = sd.recipes.eagle2(demo.eagle_head, total_tokens=8, depth=3, top_k=3)  # a tree sized for a CPU
    fast = sd.generate(demo.target, ids, drafter=drafter, max_new_tokens=64)

    print(prompt.prompt[-300:], end="")
    print(demo.tokenizer.decode(plain.sequences[0, ids.shape[1]:], skip_special_tokens=True))
    print(f"\nplain: {plain.stats.tokens_per_second:.0f} tokens/s; EAGLE-2: {fast.stats.tokens_per_second:.0f} "
          f"tokens/s, tau {fast.stats.tau:.2f}, acceptance per depth "
          + ", ".join(f"{a:.2f}" for a in fast.stats.acceptance_per_depth))
    identical = torch.equal(plain.sequences, fast.sequences)
    print("EAGLE-2 output identical to plain greedy:", identical)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
