"""Session 32: the verify step's tree mask built inside its graph (``kernels.tree_mask_at`` from the device-side
write slot) against session 31's host-built mask (``tree_mask`` launched on the host before each replay, with the
parents' and presence's padding concatenated there).

Fixture target, random heads, bf16, greedy, batch 1, prompts cut to their last 256 tokens, 128 new tokens,
``generate(fast=True)``. "before" patches ``StaticAdapter.forward_commit`` back to session 31's code path (the host
mask, ``present`` built on the host, the parents copied a second time as ``decide``'s extra; its graphs under keys
of their own); both run this session's ``decide`` (the late tokens packed inside the graph), so the A/B is the
mask's part alone. Each prompt runs new, then before, method by method (interleaved,
``--reps`` rounds): ms per step (medians, and the median of per-call ratios), whether the tokens agree.

    python docs/results/fast_s32/scripts/mask_ab.py --fx .fixtures/fx --out $OUT/mask_ab.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
import specdec as sd  # noqa: E402
import specdec.static as st  # noqa: E402
from specdec.heads import Eagle1Head, Eagle3Head, MedusaHead  # noqa: E402


def _before_commit_fn(self, buf, size, M, decide, visible):
    """Session 31's captured function: the mask comes built from the host (no parents / present inputs)."""
    model = self._model_fn(buf, visible)
    valid, ends, plan, vocab = buf.valid, buf.ends, buf.compact, self.vocab_size

    def run(tokens, positions, mask, slots, *extra):
        logits, feats = model(tokens if vocab is None else tokens.clamp(0, vocab - 1), positions, mask, slots)
        if size > M:
            logits, feats = logits[:, :M], tuple(f[:, :M] for f in feats)
        keep, counts, outputs = decide(logits, tuple(feats), tokens[:, :M], positions[:, :M], *extra)
        plan.move_to_ends(keep, slots[:1], ends)
        st._kept_at_ends(valid, ends, torch.arange(keep.shape[1], device=keep.device)[None, :], counts)
        return outputs, keep, counts
    return run


@torch.no_grad()
def _before_forward_commit(self, state, tokens, parents, positions, present, decide, extra, key):
    if present is None:  # session 31's step() built it on the host and passed the parents to decide as an extra
        present = parents >= 0
        present[:, 0] = True
    extra = (parents,) + tuple(extra)
    buf = self._check_state(state)
    st._consume(state, "forward")
    M = tokens.shape[1]
    size = st.bucket_for(M, self.buckets)
    state = self._tightened(state, size)
    self._check_room(state, size, M)
    self._late_ends(buf, state)
    visible = self._visible(state, size)
    (outputs, keep, counts), _ = self._bucket_step(
        buf, state, ("before", size, M, key, st._spec(extra), visible), size, (tokens, parents, positions, present),
        extra, lambda: _before_commit_fn(self, buf, size, M, decide, visible),
        lambda step, inputs: self._capture_committing(buf, step, inputs), visible, device_mask=False)
    return outputs, self._late_committed(buf, state, keep.shape[1], counts)


@contextlib.contextmanager
def before():
    new = st.StaticAdapter.forward_commit
    st.StaticAdapter.forward_commit = _before_forward_commit
    try:
        yield
    finally:
        st.StaticAdapter.forward_commit = new


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fx", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["EAGLE-2", "EAGLE-3", "lookup", "Medusa"])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import transformers
    dev = args.device
    path = os.path.join(args.fx, "pycoder-18m")
    target = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with open(os.path.join(args.fx, "pycode-heldout.jsonl")) as fh:
        texts = [json.loads(line)["prompt"] for line in fh]
    ids = [t for t in (tok(p, return_tensors="pt").input_ids[0] for p in texts) if t.shape[0] >= 256]
    ids = [t[-256:].to(dev)[None] for t in ids[:args.prompts]]
    torch.manual_seed(0)
    bf = dict(device=dev, dtype=torch.bfloat16)
    makers = {"EAGLE-2": lambda: sd.recipes.eagle2(Eagle1Head.from_target(target).to(**bf).eval()),
              "EAGLE-3": lambda: sd.recipes.eagle3(Eagle3Head.from_target(target).to(**bf).eval()),
              "lookup": lambda: sd.recipes.prompt_lookup(num_drafts=10, fixed_width=True),
              "Medusa": lambda: sd.recipes.medusa1(MedusaHead.from_target(target).to(**bf).eval())}
    drafters = {name: makers[name]() for name in args.methods}

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def call(drafter, x):
        return sd.generate(target, x, drafter=drafter, max_new_tokens=128, eos_token_id=[], fast=True)

    for drafter in drafters.values():  # captures first, both ways
        for x in ids:
            call(drafter, x)
            with before():
                call(drafter, x)
    sync()
    per_step = {(n, v): [] for n in drafters for v in ("new", "before")}
    tokens = {(n, v): [] for n in drafters for v in ("new", "before")}
    for _ in range(args.reps):
        for x in ids:
            for name, drafter in drafters.items():
                for variant in ("new", "before"):
                    ctx = before() if variant == "before" else contextlib.nullcontext()
                    with ctx:
                        sync()
                        t = time.perf_counter()
                        out = call(drafter, x)
                        sync()
                    per_step[(name, variant)].append(1e3 * (time.perf_counter() - t) / out.stats.num_steps)
                    tokens[(name, variant)].append(out.sequences.tolist())
    res = {}
    for name in drafters:
        new, old = per_step[(name, "new")], per_step[(name, "before")]
        ratio = statistics.median(a / b for a, b in zip(new, old))
        res[name] = {"new ms/step": round(statistics.median(new), 4),
                     "before ms/step": round(statistics.median(old), 4),
                     "new/before (median of per-call ratios)": round(ratio, 4),
                     "calls": len(new),
                     "calls with the same tokens": sum(a == b for a, b in zip(tokens[(name, "new")],
                                                                            tokens[(name, "before")]))}
        print(f"{name:8s}", json.dumps(res[name]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
