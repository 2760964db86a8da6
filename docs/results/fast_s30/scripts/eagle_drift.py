"""Session 30, call H: where do EAGLE's folded drafts leave the unfolded ones in bf16? The fixture target, a random
EAGLE-1 head on EAGLE-2's dynamic tree, bf16, one prompt, 128 tokens: the drafts of generate(fast=True) with the
fold on twice and off twice (run-to-run determinism of each), compared step by step. Run with SPECDEC_PDL=0 and
without (programmatic dependent launch on: a kernel reading before its wait would race)."""
import json
import os
import sys

import torch
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
import specdec as sd  # noqa: E402
from specdec.drafters import EagleDrafter  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.trees import DynamicTree  # noqa: E402

fx = sys.argv[1]
target = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(fx, "pycoder-18m"),
                                                           dtype=torch.bfloat16).cuda().eval()
tok = transformers.AutoTokenizer.from_pretrained(os.path.join(fx, "pycoder-18m"))
with open(os.path.join(fx, "pycode-heldout.jsonl")) as fh:
    prompt = json.loads(fh.readline())["prompt"]
ids = tok(prompt, return_tensors="pt").input_ids[:, -256:].cuda()
torch.manual_seed(0)
head = Eagle1Head.from_target(target).to("cuda", torch.bfloat16).eval()
runs = {}
for name, fold in (("on 1", True), ("off 1", False), ("on 2", True), ("off 2", False)):
    g = GraphedDrafter(EagleDrafter(head, DynamicTree(total_tokens=60, depth=6, top_k=10), fold=fold))
    drafts, propose = [], g.propose

    def recorded(state, request, propose=propose, drafts=drafts):
        draft, state = propose(state, request)
        drafts.append(torch.cat([draft.tokens, draft.parents], 1).cpu())
        return draft, state
    g.propose = recorded
    sd.generate(target, ids, drafter=g, max_new_tokens=128, eos_token_id=[], fast=True)  # captures
    drafts.clear()
    out = sd.generate(target, ids, drafter=g, max_new_tokens=128, eos_token_id=[], fast=True)
    runs[name] = (list(drafts), out.sequences.cpu(), g.counts["folded"])


def first_diff(a, b):
    n = min(len(a), len(b))
    return next((i for i in range(n) if not torch.equal(a[i], b[i])), None if len(a) == len(b) else n)


pdl = os.environ.get("SPECDEC_PDL", "default")
for x, y in (("on 1", "on 2"), ("off 1", "off 2"), ("on 1", "off 1"), ("on 2", "off 2")):
    print(f"PDL {pdl}: {x} vs {y}: steps {len(runs[x][0])}/{len(runs[y][0])}, first differing draft "
          f"{first_diff(runs[x][0], runs[y][0])}, same tokens {torch.equal(runs[x][1], runs[y][1])}", flush=True)
print("folded:", {k: v[2] for k, v in runs.items()})
