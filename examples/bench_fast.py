"""The fixture on the fast path, side by side with gpt-fast in the same process (issue 13's measurement).

Settings are the anchor's (``shared/anchors/gptfast_fixture.py``): bf16, greedy, the first ``--num-prompts``
held-out prompts cut to their last ``--prompt-tokens`` (256) tokens (shorter ones skipped), exactly
``--max-new-tokens`` (128) new tokens (EOS never stops a row), cuDNN SDPA off.

Batch 1, methods interleaved per prompt after ``--warmup`` untimed prompts:

- ``HF vanilla``: HF ``generate`` (greedy, ``min_new_tokens`` = ``max_new_tokens``);
- ``gpt-fast vanilla`` / ``gpt-fast SpS K=4,6`` (with ``--gptfast DIR``, the anchors folder holding ``gptfast/``):
  gpt-fast's ``generate`` on the fixture converted to its layout, ``decode_one_token`` and ``model_forward``
  compiled with ``torch.compile(mode="reduce-overhead", fullgraph=True)`` as the anchor does;
- ``specdec eager plain`` / ``specdec fast plain``: :func:`specdec.generate` without a drafter, ``fast=False/True``;
- ``specdec fast SpS K=4,6``: the draft model (``DraftModelDrafter(fast=True)``: the draft model on its own static
  cache, graphed; the chain as one captured step, ``capture_chain=True``), target on the fast path; each K again
  with ``capture_chain=False`` ("level by level": one replay per level); and the first K with the draft model eager;
- ``specdec fast prompt lookup``: ``PromptLookupDrafter(fixed_width=True)`` (no host sync in ``propose``);
- ``specdec fast EAGLE-2`` / ``EAGLE-3`` (``--eagle2`` / ``--eagle3`` head folders; default trees), and the
  parallel drafters ``--peagle`` / ``--dflash`` / ``--dspark`` / ``--medusa`` when given (Medusa: the
  ``mc_sim_7b_63`` tree of ``recipes.medusa``; P-EAGLE / DFlash / DSpark: the chain of their levels, and with
  ``--parallel-tree NAME`` also a row verifying that level-wise tree of their levels' top-k; with ``--chain-k K ..``
  also their chains of K levels, and with ``--prefetch-rows`` rows with ``GraphedDrafter.prefetch`` on, the next
  draft replayed inside the update's graph); with ``--fp8-heads``
  also ``specdec fast EAGLE-2 float8`` / ``EAGLE-3 float8``: a copy of the head with its linears rounded to float8
  (:func:`specdec.nn.quantize_fp8_`; lossless, tau may change); with ``--int4-heads G ..`` also
  ``specdec fast EAGLE-2 int4 gG`` / ``EAGLE-3 int4 gG``: the head on 4-bit weights, ``G`` inputs per scale
  (:func:`specdec.nn.quantize_int4_`; lossless, tau may change more).

Per method: tokens/s, speedup against HF vanilla, ratio against gpt-fast vanilla, tau (tokens per target forward),
and the share of prompts whose output equals gpt-fast vanilla's and HF vanilla's. Then batch 4 and 16 (left-padded
batches of different prompts) for HF vanilla, specdec eager plain, fast plain and fast EAGLE-3; gpt-fast's
``generate`` decodes one prompt (batch 1) here, so it has no batched rows. Last, the per-step phases of fast
EAGLE-3 (``generate(profile=True)``: synchronised between phases, so their sum exceeds the unprofiled step).

Every method runs inside ``try``: an error is recorded (and the method dropped) instead of ending the run.
``--max-seconds`` bounds each timed loop. Writes ``results.json``, ``results.md`` and ``results.png`` (tokens/s) to
``--out`` and prints a short table last.

Examples::

    python examples/bench_fast.py --target ../shared/models/pycoder-18m --draft ../shared/models/pycoder-draft-4m \\
        --data ../shared/data/pycode-heldout.jsonl --gptfast ../shared/anchors \\
        --eagle2 runs/eagle1/final --eagle3 runs/eagle3/final --out runs/bench_fast          # the H200
    python examples/bench_fast.py --quick --out runs/bench_fast_quick                       # CPU smoke test
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import os
import re
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import specdec as sd  # noqa: E402
from specdec.bench import left_pad, no_gc  # noqa: E402
from specdec.drafters import DraftModelDrafter, PromptLookupDrafter  # noqa: E402
from specdec.kernels import pdl_enabled  # noqa: E402
from specdec.nn import quantize_fp8_, quantize_int4_  # noqa: E402
from specdec.static import capacity_for  # noqa: E402


class Run(NamedTuple):
    """One method on one prompt (or batch): new tokens per row, target forwards, and (gpt-fast) accept counts."""

    tokens: list            # per row, the new token ids
    steps: int | None       # target forwards after the prefill (None: not known, e.g. HF)
    emitted: int            # tokens emitted by those steps (for tau)


# ---------------------------------------------------------------------------------------------------- inputs
def add_fixture_args(ap, num_prompts: int) -> None:
    """The fixture arguments the fast-path scripts share: ``--target --data --eagle3 --gptfast --num-prompts
    --prompt-tokens --max-new-tokens`` (the anchor's 256-token prompts and 128 new tokens by default)."""
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--eagle3", default=None, help="EAGLE-3 head folder")
    ap.add_argument("--gptfast", default=None, help="anchors folder holding gptfast/ (gpt-fast vanilla row)")
    ap.add_argument("--num-prompts", type=int, default=num_prompts)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=128)


def load_prompts(path: str, tokenizer, count: int, length: int, device) -> list[torch.Tensor]:
    """The first ``count`` prompts of a JSONL file, each cut to its last ``length`` tokens; shorter ones skipped.

    Returns:
        A list of ``[length]`` int64 tensors (as the anchor: no special tokens added).
    """
    out = []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()][:count]
    for row in rows:
        ids = tokenizer(row["prompt"], add_special_tokens=False).input_ids
        if len(ids) >= length:
            out.append(torch.tensor(ids[-length:], dtype=torch.long, device=device))
    return out


def quick_models(device):
    """Tiny random Llama target and draft (CPU smoke mode), float32, with random EAGLE-1/EAGLE-3, Medusa and P-EAGLE
    heads."""
    import transformers

    from specdec.heads import Eagle1Head, Eagle3Head, MedusaHead, PEagleHead

    def build(layers, hidden, seed):
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=1024, tie_word_embeddings=True)
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                             dtype=torch.float32).to(device).eval()

    target, draft = build(4, 64, 0), build(1, 32, 1)
    torch.manual_seed(2)
    heads = {"eagle2": Eagle1Head.from_target(target).to(device).eval(),
             "eagle3": Eagle3Head.from_target(target).to(device).eval(),
             "medusa": MedusaHead.from_target(target, num_heads=4).to(device).eval(),
             "peagle": PEagleHead.from_target(target, num_layers=1, max_drafts=4).to(device).eval()}
    return target, draft, heads


def quick_prompts(count: int, length: int, device) -> list[torch.Tensor]:
    """Random prompts with a repeated motif (prompt lookup finds matches)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        motif = torch.randint(1, 256, (24,), generator=g)
        out.append(motif.repeat(length // 24 + 1)[:length].to(device))
    return out


# ---------------------------------------------------------------------------------------------------- gpt-fast
def gptfast_modules(folder: str):
    """gpt-fast's ``generate`` and ``model`` modules from the anchors folder (or its ``gptfast/`` subfolder).

    Importing ``generate`` sets inductor options process-wide (gpt-fast's own choice), as in the anchor.
    """
    sub = os.path.join(folder, "gptfast")
    folder = sub if os.path.isdir(sub) else folder
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import generate as gptfast_generate
    import model as gptfast_model
    return gptfast_generate, gptfast_model


def to_gptfast(hf_model, gptfast_model, device, dtype):
    """The HF Llama ``hf_model`` as a gpt-fast ``Transformer`` with the same weights.

    gpt-fast applies RoPE to interleaved pairs ``(x[2i], x[2i+1])`` of each head, HF to the halves
    ``(x[i], x[i + d/2])``; so the query and key rows of each head are reordered from ``(two half)`` to
    ``(half two)``. Values and every other weight keep their layout; q, k, v are fused into ``wqkv``.
    """
    from einops import rearrange

    c = hf_model.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = c.hidden_size // heads
    rope = getattr(c, "rope_parameters", None) or {}
    args = gptfast_model.ModelArgs(
        block_size=c.max_position_embeddings, vocab_size=c.vocab_size, n_layer=c.num_hidden_layers, n_head=heads,
        n_local_heads=kv_heads, dim=c.hidden_size, intermediate_size=c.intermediate_size,
        rope_base=rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)), norm_eps=c.rms_norm_eps)
    if args.head_dim != head_dim:
        raise ValueError(f"gpt-fast derives head_dim {args.head_dim}, the HF model has {head_dim}")
    src = {k: v.detach() for k, v in hf_model.state_dict().items()}

    def rope_rows(w, n):  # per head: halves layout -> interleaved pairs
        return rearrange(w, "(h two half) d -> (h half two) d", h=n, two=2)

    out = {"tok_embeddings.weight": src["model.embed_tokens.weight"], "norm.weight": src["model.norm.weight"],
           "output.weight": src.get("lm_head.weight", src["model.embed_tokens.weight"])}
    for i in range(c.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        attn = p + "self_attn."
        out[q + "attention.wqkv.weight"] = torch.cat([rope_rows(src[attn + "q_proj.weight"], heads),
                                                      rope_rows(src[attn + "k_proj.weight"], kv_heads),
                                                      src[attn + "v_proj.weight"]])
        out[q + "attention.wo.weight"] = src[attn + "o_proj.weight"]
        out[q + "feed_forward.w1.weight"] = src[p + "mlp.gate_proj.weight"]
        out[q + "feed_forward.w3.weight"] = src[p + "mlp.up_proj.weight"]
        out[q + "feed_forward.w2.weight"] = src[p + "mlp.down_proj.weight"]
        out[q + "attention_norm.weight"] = src[p + "input_layernorm.weight"]
        out[q + "ffn_norm.weight"] = src[p + "post_attention_layernorm.weight"]
    with torch.device("meta"):
        model = gptfast_model.Transformer(args)
    model.load_state_dict({k: v.clone() for k, v in out.items()}, assign=True, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def gptfast_methods(folder: str, target, draft, ks, new_tokens: int, device, dtype) -> dict[str, Callable]:
    """Runners for gpt-fast vanilla and speculative decoding (K in ``ks``), compiled as the anchor compiles them."""
    G, M = gptfast_modules(folder)
    gm = to_gptfast(target, M, device, dtype)
    gd = to_gptfast(draft, M, device, dtype) if draft is not None else None
    # gpt-fast's generate calls these module functions by name: compiling means replacing them (its own recipe).
    G.decode_one_token = torch.compile(G.decode_one_token, mode="reduce-overhead", fullgraph=True)
    G.model_forward = torch.compile(G.model_forward, mode="reduce-overhead", fullgraph=True)

    def make(draft_model, k):
        def run(ids: torch.Tensor) -> Run:
            if ids.dim() != 1:
                raise ValueError("gpt-fast's generate here decodes one prompt (batch 1)")
            seq, stats = G.generate(gm, ids, new_tokens, batch_size=1, interactive=False, draft_model=draft_model,
                                    speculate_k=k, temperature=0.0)
            tokens = seq[0, ids.numel():].tolist()
            if draft_model is None:
                return Run([tokens], new_tokens - 1, new_tokens - 1)
            counts = stats["accept_counts"]
            return Run([tokens], sum(counts), sum((i + 1) * c for i, c in enumerate(counts)))
        return run

    methods = {"gpt-fast vanilla": make(None, 4)}
    for k in ks if gd is not None else ():
        methods[f"gpt-fast SpS K={k}"] = make(gd, k)
    return methods


# ---------------------------------------------------------------------------------------------------- methods
def hf_vanilla(target, new_tokens: int) -> Callable:
    """HF ``generate``, greedy, exactly ``new_tokens`` per row (``min_new_tokens``), on a (left-padded) batch."""
    def run(ids: torch.Tensor) -> Run:
        batch, mask = left_pad([ids] if ids.dim() == 1 else list(ids))
        with torch.no_grad():
            out = target.generate(input_ids=batch, attention_mask=mask, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False)
        return Run(out[:, batch.shape[1]:].tolist(), None, 0)
    return run


def specdec_run(target, drafter, new_tokens: int, *, fast: bool | str, profile: bool = False,
                num_drafts: int | None = None) -> Callable:
    """:func:`specdec.generate` on a prompt ``[T]`` or a batch of prompts ``[B, T]`` (left-padded), no EOS stop;
    ``num_drafts``: ``K`` of every step (default: the drafter's ``max_num_drafts``)."""
    def run(ids: torch.Tensor) -> Run:
        batch, mask = left_pad([ids] if ids.dim() == 1 else list(ids))
        out = sd.generate(target, batch, attention_mask=mask, drafter=drafter, max_new_tokens=new_tokens,
                          eos_token_id=[], fast=fast, profile=profile, num_drafts=num_drafts)
        s = out.stats
        T = batch.shape[1]
        tokens = [row[T:T + n].tolist() for row, n in zip(out.sequences, out.num_new_tokens.tolist())]
        run.last_stats = s  # read by eagle3_phases
        return Run(tokens, s.num_steps * batch.shape[0], round(s.tau * s.num_steps * batch.shape[0]))
    run.drafter = drafter
    return run


def specdec_methods(target, draft, heads: dict, args, errors: dict) -> dict[str, Callable]:
    """The specdec rows at batch 1 (drafters built once; the fast path keeps their graphs between calls).

    A drafter that cannot be built (e.g. a head of the wrong kind for its recipe) is recorded in ``errors``.
    """
    n = args.max_new_tokens
    draft_capacity = capacity_for(args.prompt_tokens, n, 16)
    makers = {"specdec eager plain": (lambda: None, False), "specdec fast plain": (lambda: None, True)}
    for k in args.draft_k if draft is not None else ():
        makers[f"specdec fast SpS K={k}"] = (  # the chain as one captured step (capture_chain, the default)
            lambda k=k: DraftModelDrafter(draft, num_drafts=k, fast=True, capacity=draft_capacity), True)
        makers[f"specdec fast SpS K={k}, level by level"] = (
            lambda k=k: DraftModelDrafter(draft, num_drafts=k, fast=True, capacity=draft_capacity,
                                          capture_chain=False), True)
    if draft is not None and args.draft_k:  # Part of the story: the same K with the draft model left eager
        k = args.draft_k[0]
        makers[f"specdec fast SpS K={k}, eager draft"] = (lambda k=k: DraftModelDrafter(draft, num_drafts=k), True)
    makers[f"specdec fast prompt lookup K={args.lookup_k}"] = (
        lambda: PromptLookupDrafter(num_drafts=args.lookup_k, fixed_width=True), True)
    recipes = {"eagle2": ("EAGLE-2", sd.recipes.eagle2), "eagle3": ("EAGLE-3", sd.recipes.eagle3),
               "peagle": ("P-EAGLE", sd.recipes.peagle), "dflash": ("DFlash", sd.recipes.dflash),
               "dspark": ("DSpark", sd.recipes.dspark), "medusa": ("Medusa", sd.recipes.medusa)}
    for key, head in heads.items():
        label, recipe = recipes[key]
        makers[f"specdec fast {label}"] = (lambda recipe=recipe, head=head: recipe(head), True)
        if key in ("eagle2", "eagle3") and getattr(args, "fp8_heads", False):
            makers[f"specdec fast {label} float8"] = (
                lambda recipe=recipe, head=head: recipe(quantize_fp8_(copy.deepcopy(head).requires_grad_(False))),
                True)
        for group in (getattr(args, "int4_heads", None) or ()) if key in ("eagle2", "eagle3") else ():
            makers[f"specdec fast {label} int4 g{group}"] = (
                lambda recipe=recipe, head=head, group=group: recipe(
                    quantize_int4_(copy.deepcopy(head).requires_grad_(False), group=group)), True)
        if key in ("peagle", "dflash", "dspark"):
            for k in getattr(args, "chain_k", None) or ():  # the same chain drafter asked for K = k levels a step
                makers[f"specdec fast {label} chain K={k}"] = (lambda recipe=recipe, head=head: recipe(head), True, k)
            if getattr(args, "prefetch_rows", False):  # the next draft inside the update (GraphedDrafter.prefetch)
                makers[f"specdec fast {label}, next draft in the update"] = (
                    lambda recipe=recipe, head=head: _prefetching(recipe(head)), True)
        if key in ("peagle", "dflash", "dspark") and getattr(args, "parallel_tree", None):
            # the same head verifying a level-wise tree of its levels' top-k (Medusa's trees), not its chain
            tree = args.parallel_tree
            makers[f"specdec fast {label} tree {tree}"] = (
                lambda recipe=recipe, head=head, tree=tree: recipe(head, tree=tree), True)
    if args.compile:  # the same target forwards compiled before capture (generate(fast="compile"))
        makers["specdec fast+compile plain"] = (lambda: None, "compile")
        for key in ("eagle2", "eagle3", "dflash"):
            if key in heads:
                label, recipe = recipes[key]
                makers[f"specdec fast+compile {label}"] = (lambda recipe=recipe, head=heads[key]: recipe(head),
                                                           "compile")
        for k in args.draft_k if draft is not None else ():
            makers[f"specdec fast+compile SpS K={k}"] = (
                lambda k=k: DraftModelDrafter(draft, num_drafts=k, fast="compile", capacity=draft_capacity), "compile")
            makers[f"specdec fast+compile SpS K={k}, level by level"] = (
                lambda k=k: DraftModelDrafter(draft, num_drafts=k, fast="compile", capacity=draft_capacity,
                                              capture_chain=False), "compile")
    if args.only:
        makers = {name: v for name, v in makers.items() if any(part in name for part in args.only)}
    if getattr(args, "skip", None):
        makers = {name: v for name, v in makers.items() if not any(part in name for part in args.skip)}
    methods = {}
    for name, (make, fast, *k) in makers.items():
        try:
            methods[name] = specdec_run(target, make(), n, fast=fast, num_drafts=k[0] if k else None)
        except Exception as err:  # recorded; the other rows still run
            errors[f"batch 1 {name}"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    return methods


def _prefetching(drafter):
    """``drafter`` (a :class:`~specdec.graphs.GraphedDrafter`) with ``prefetch`` on: its next draft replays inside
    the update's graph."""
    drafter.prefetch = True
    return drafter


def load_heads(args, target, device, dtype) -> dict:
    """The draft heads given on the command line, by recipe key (a failed load is reported and skipped)."""
    loaders = {"eagle2": sd.formats.load_eagle_head, "eagle3": sd.formats.load_eagle_head,
               "peagle": sd.formats.load_peagle_head, "dflash": sd.formats.load_dflash_head,
               "dspark": sd.formats.load_dflash_head, "medusa": sd.formats.load_medusa_head}
    heads = {}
    for key, load in loaders.items():
        path = getattr(args, key)
        if path:
            try:
                heads[key] = load(path, target, dtype=dtype, device=device)
            except Exception as err:  # report, keep benchmarking the rest
                print(f"could not load --{key} {path}: {type(err).__name__}: {err}", flush=True)
    return heads


# ---------------------------------------------------------------------------------------------------- timing
def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


_PER_STEP = ("replays", "prefetched", "folded", "in_place")  # GraphedDrafter counters every step moves: not one-offs


def capture_tally(method: Callable, target=None) -> dict[str, int]:
    """Counters that move when a call captures or rebuilds instead of replaying: the method's drafter's
    (``GraphedDrafter.counts``: captures, eager steps, buffer changes; not the per-step replays, prefetches,
    folds and in-place reads) and the fast path's for ``target``
    (:func:`specdec.static.held_graphs`, summed over its held buffers: builds, captures), and the Triton kernels
    loaded or compiled (:func:`specdec.bench.triton_kernels_loaded`)."""
    drafter = getattr(method, "drafter", None)
    wrappers = [drafter] if hasattr(drafter, "counts") else sd.static.graphed_wrappers(drafter)
    tally = collections.Counter()
    for wrapper in wrappers:  # a drafter generate() wraps itself: the wrappers it keeps on the drafter
        tally.update({f"drafter {k}": v for k, v in wrapper.counts.items() if k not in _PER_STEP})
    tally = dict(tally)
    if target is not None:
        held = sd.static.held_graphs(target).values()
        tally.update({"target builds": sum(h["builds"] for h in held),
                      "target captures": sum(h["captures"] for h in held)})
    tally["triton kernels"] = sd.bench.triton_kernels_loaded()
    frames = _compiled_frames()
    if frames:  # torch.compile has run in this process (gpt-fast's steps, fast="compile"): a recompile shows
        tally["compiled frames"] = frames
    return tally


def _compiled_frames() -> int:
    """Frames torch.compile has compiled so far in this process (0 before any compile)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["frames"]["total"]) if dynamo is not None else 0


def time_methods(methods: dict[str, Callable], inputs: list, *, warmup: int, max_seconds: float | None, device,
                 errors: dict, label: str, target=None, timing: dict | None = None) -> dict:
    """Time every method on every input, interleaved per input, after ``warmup`` untimed inputs.

    A method that raises is recorded in ``errors`` and dropped. Returns, per method, its runs and seconds. With a
    ``timing`` dict, also fills, per method, ``per_input_s`` (each timed call's seconds) and ``captured_while_timed``
    (what :func:`capture_tally` moved by inside the timed calls: nonzero means the figure holds capture or
    rebuild time a longer run would not pay per call).
    """
    from tqdm.auto import tqdm

    live = dict(methods)

    def call(name, ids):
        try:
            return live[name](ids)
        except Exception as err:  # recorded; the benchmark goes on without this method
            errors[f"{label} {name}"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
            del live[name]
            return None

    for ids in inputs[:warmup]:
        for name in list(live):
            call(name, ids)
    runs = {name: [] for name in methods}
    seconds = {name: 0.0 for name in methods}
    start = time.perf_counter()
    per_input = {name: [] for name in methods}
    moved = {name: collections.Counter() for name in methods}
    for ids in tqdm(inputs, desc=label):
        for name in list(live):
            before = capture_tally(live[name], target)
            with no_gc():  # a collection inside a timed call is not the call's work
                _sync(device)
                t0 = time.perf_counter()
                out = call(name, ids)
                _sync(device)
                dt = time.perf_counter() - t0
            if out is not None:
                seconds[name] += dt
                per_input[name].append(round(dt, 5))
                runs[name].append(out)
                after = capture_tally(live[name], target)
                moved[name].update({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
    done = min((len(runs[name]) for name in live), default=0)  # every live method on the same inputs
    if timing is not None:
        for name in live:
            timing[name] = {"per_input_s": per_input[name][:done], "captured_while_timed": dict(moved[name])}
    return {name: (runs[name][:done], seconds[name] * done / max(len(runs[name]), 1))
            for name in live if runs[name]}


def summarise(timed: dict, *, batch: int, timing: dict | None = None) -> list[dict]:
    """Per method: tokens/s, speedup vs HF vanilla, ratio vs gpt-fast vanilla, tau, same-output rates; ms per
    decoding step where steps are counted; with ``timing`` (from :func:`time_methods`), each call's seconds and
    what was captured or rebuilt while timed."""
    hf = timed.get("HF vanilla")
    gf = timed.get("gpt-fast vanilla")

    def rate(name):
        runs, secs = timed[name]
        return sum(len(t) for r in runs for t in r.tokens) / secs

    def same(runs, ref):
        if ref is None:
            return None
        pairs = [(a, b) for r, q in zip(runs, ref[0]) for a, b in zip(r.tokens, q.tokens)]
        return sum(a == b for a, b in pairs) / len(pairs) if pairs else None

    rows = []
    for name, (runs, secs) in timed.items():
        steps = [r.steps for r in runs]
        tau = (sum(r.emitted for r in runs) / sum(steps)) if all(s for s in steps) else None
        tps = rate(name)
        rows.append(dict(method=name, batch=batch, inputs=len(runs), tokens_per_s=tps, seconds=secs,
                         speedup_vs_hf=tps / rate("HF vanilla") if hf else None,
                         ratio_vs_gptfast=tps / rate("gpt-fast vanilla") if gf else None, tau=tau,
                         same_as_gptfast=same(runs, gf), same_as_hf=same(runs, hf),
                         ms_per_step=1e3 * secs / sum(steps) * batch if all(s for s in steps) else None,
                         **(timing or {}).get(name, {})))
    return rows


def plain_anatomy(target, prompt: torch.Tensor, new_tokens: int, fast: bool | str = True, reps: int = 200) -> dict:
    """Where a fast plain step's time goes: ms per token of ``generate`` against back-to-back replays of the
    captured plain forward alone (GPU time: the host launches ahead); the difference is host work the GPU waits
    for (the step's Python, its one sync)."""
    from specdec.static import _STORES

    run = specdec_run(target, None, new_tokens, fast=fast)
    run(prompt)
    run(prompt)
    s = run.last_stats
    step_ms = 1e3 * (s.wall_time - s.prefill_time) / s.num_steps
    mode = "compile" if fast == "compile" else "graphs"
    store = next(st for key, st in _STORES[target].items() if key[0] == () and key[2] == mode)
    runner = store.buffers.plain.runner
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        runner._run()
    torch.cuda.synchronize()
    replay_ms = 1e3 * (time.perf_counter() - t0) / reps
    return {"fast": str(fast), "generate_ms_per_token": step_ms, "replay_only_ms": replay_ms,
            "host_ms_per_token": step_ms - replay_ms}


def eagle3_phases(drafter, target, prompts, new_tokens: int, fast: bool | str = True) -> dict:
    """Per-step phase times (ms) of ``drafter`` on the fast path with ``profile=True``, and the unprofiled step."""
    profiled = specdec_run(target, drafter, new_tokens, fast=fast, profile=True)
    plain = specdec_run(target, drafter, new_tokens, fast=fast)
    for ids in prompts:  # warm: every graph these prompts need is captured before the timed calls
        plain(ids)
    totals, steps, wall = {}, 0, 0.0
    for ids in prompts:
        profiled(ids)
        s = profiled.last_stats
        for k, v in (s.phase_times or {}).items():
            totals[k] = totals.get(k, 0.0) + v
        steps += s.num_steps
        plain(ids)
        wall += plain.last_stats.wall_time - plain.last_stats.prefill_time
    return {"phases_ms_per_step": {k: 1e3 * v / steps for k, v in totals.items()},
            "unprofiled_ms_per_step": 1e3 * wall / steps, "steps": steps}


# ---------------------------------------------------------------------------------------------------- report
def prompt_count(rows: list[dict], loaded: int) -> str:
    """The title's prompt count: the batch-1 rows' timed inputs when ``--max-seconds`` stopped them early, e.g.
    ``"4 of 8 prompts timed"`` (a range where separate timed loops stopped at different counts), else
    ``"8 prompts"``."""
    timed = [r["inputs"] for r in rows if r.get("batch") == 1 and r.get("inputs") is not None]
    if not timed or max(timed) >= loaded:
        return f"{loaded} prompts"
    lo, hi = min(timed), max(timed)
    return f"{hi if lo == hi else f'{lo}-{hi}'} of {loaded} prompts timed"


def void_rows(rows: list[dict], min_inputs: int = 2) -> list[str]:
    """The batch-1 rows whose figure is not a measurement: timed on fewer than ``min_inputs`` prompts, or holding a
    capture, rebuild, kernel load or compile inside a timed call (``captured_while_timed``; a drafter's eager steps,
    paid by every call by design, do not count)."""
    void = []
    for r in rows:
        if r.get("batch") != 1:
            continue
        moved = {k for k in r.get("captured_while_timed") or {} if k != "drafter eager"}
        if r.get("inputs", min_inputs) < min_inputs or moved:
            void.append(f"{r['method']} ({r.get('inputs')} timed, {', '.join(sorted(moved)) or 'nothing'} moved)")
    return void


def checks(rows: list[dict]) -> list[str]:
    """Issue 13's targets, each as one line with the measured figures. When a batch-1 row is void (:func:`void_rows`)
    the run is no measurement: a first line names those rows and every verdict reads ``void`` (the methods run
    interleaved, so one row's compile or capture stops the timed loop for all of them)."""
    lines = _checks(rows)
    void = void_rows(rows)
    if not void:
        return lines
    return ([f"VOID, not a measurement: {'; '.join(void)}; raise --warmup, --num-prompts or --max-seconds"]
            + [re.sub(r": (ok|MISS.*)$", r": void (\1)", line) for line in lines])


def _checks(rows: list[dict]) -> list[str]:
    by = {r["method"]: r for r in rows if r["batch"] == 1}
    gf = by.get("gpt-fast vanilla")
    if gf is None:
        return ["(no gpt-fast rows: pass --gptfast DIR for the issue's comparisons)"]
    out = []
    for variant in ("fast", "fast+compile"):
        plain = by.get(f"specdec {variant} plain")
        if plain:
            t = gf["tokens_per_s"] / plain["tokens_per_s"]
            out.append(f"{variant} plain time / gpt-fast vanilla time = {t:.2f} (target <= 1.2): "
                       f"{'ok' if t <= 1.2 else 'MISS'}")
        e3 = by.get(f"specdec {variant} EAGLE-3")
        if e3:
            r = e3["ratio_vs_gptfast"]
            out.append(f"{variant} EAGLE-3 / gpt-fast vanilla tokens/s = {r:.2f} (target >= 1.5; "
                       f"{e3['speedup_vs_hf']:.1f}x HF vanilla): {'ok' if r >= 1.5 else 'MISS'}")
        for k in sorted({_row_k(name) for name in by if name.startswith("gpt-fast SpS")}):
            theirs = by.get(f"gpt-fast SpS K={k}")
            for suffix in ("", ", level by level"):
                ours = by.get(f"specdec {variant} SpS K={k}{suffix}")
                if ours and theirs:
                    r = ours["tokens_per_s"] / theirs["tokens_per_s"]
                    out.append(f"{variant} SpS K={k}{suffix} / gpt-fast SpS K={k} tokens/s = {r:.2f} (target > 1): "
                               f"{'ok' if r > 1 else 'MISS'}")
    spec = [r for r in by.values() if r["method"].startswith("specdec fast") and "plain" not in r["method"]
            and "eager draft" not in r["method"] and "level by level" not in r["method"]]  # ablation rows
    gspec = {_row_k(r["method"]): r["tokens_per_s"] for r in by.values() if r["method"].startswith("gpt-fast SpS")}
    if spec and gspec:
        # a row that names its K (SpS K=k, chain K=k) against gpt-fast's SpS at that K; every other row (trees,
        # default chains, EAGLE, prompt lookup) against gpt-fast's best SpS row
        slow = [r["method"] for r in spec
                if r["tokens_per_s"] <= gspec.get(_row_k(r["method"]), max(gspec.values()))]
        out.append("every specdec speculative method ahead of gpt-fast's SpS at its K (rows without one: gpt-fast's "
                   "best SpS row): " + ("ok" if not slow else "MISS (" + ", ".join(slow) + ")"))
    return out


def _row_k(method: str) -> int | None:
    """The ``K`` a row's name states (``SpS K=4``, ``chain K=4``, ``prompt lookup K=10``), else ``None``."""
    found = re.search(r"\bK=(\d+)", method)
    return int(found.group(1)) if found else None


def to_markdown(rows: list[dict], meta: dict, phases: dict | None, notes: list[str], errors: dict) -> str:
    """The results as Markdown: one table per batch size, the checks, the phases and the errors."""
    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    def pct(x):
        return f"{100 * x:.0f}%" if x is not None else "-"

    lines = [f"### {meta['title']}", ""]
    for batch in sorted({r["batch"] for r in rows}):
        lines += [f"**batch {batch}**", "", "| method | tokens/s | vs HF vanilla | vs gpt-fast vanilla | tau | "
                  "same as gpt-fast | same as HF | inputs |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["batch"] == batch):
            lines.append(f"| {r['method']} | {r['tokens_per_s']:.1f} | {f(r['speedup_vs_hf'], '.2f')}x | "
                         f"{f(r['ratio_vs_gptfast'], '.2f')} | {f(r['tau'], '.2f')} | "
                         f"{pct(r['same_as_gptfast'])} | {pct(r['same_as_hf'])} | {r['inputs']} |")
        lines.append("")
    if batch_note := meta.get("batch_note"):
        lines += [batch_note, ""]
    lines += ["Checks (issue 13):", ""] + [f"- {c}" for c in notes] + [""]
    if phases:
        lines += ["Fast EAGLE-3, per step (profile=True, synchronised between phases), with the Triton kernels "
                  "and with their torch references; then the fast plain step's anatomy:", "", "```",
                  json.dumps(phases, indent=1), "```", ""]
    if errors:
        lines += ["Errors:", ""] + [f"- {k}: {v}" for k, v in errors.items()] + [""]
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    """Horizontal bars of tokens/s, one panel per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 0.4 * len(rows) + 2), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        sel = [r for r in rows if r["batch"] == batch]
        colors = ["#C44E52" if r["method"].startswith("gpt-fast") else "#8C8C8C" if r["method"].startswith("HF")
                  else "#4C72B0" for r in sel]
        ax.barh([r["method"] for r in sel], [r["tokens_per_s"] for r in sel], color=colors)
        for i, r in enumerate(sel):
            ax.text(r["tokens_per_s"], i, f" {r['tokens_per_s']:.0f}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s")
        ax.set_title(f"batch {batch}")
    fig.suptitle(textwrap.fill(title, 45 * len(batches) + 25), fontsize=9)  # wrapped to the figure's width
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def short_table(rows: list[dict]) -> str:
    """A few columns, one line per row, for the end of the log."""
    def f(x, fmt):
        return format(x, fmt) if x is not None else "-"

    lines = [f"{'batch':>5} {'method':<50} {'tok/s':>9} {'vs HF':>7} {'vs gf':>6} {'tau':>5} {'ms/step':>7}"]
    for r in rows:
        lines.append(f"{r['batch']:>5} {r['method']:<50} {r['tokens_per_s']:>9.1f} {f(r['speedup_vs_hf'], '.2f'):>7} "
                     f"{f(r['ratio_vs_gptfast'], '.2f'):>6} {f(r['tau'], '.2f'):>5} "
                     f"{f(r.get('ms_per_step'), '.3f'):>7}")
    moved, eager = [], []
    for r in rows:
        tally = dict(r.get("captured_while_timed") or {})
        steps = tally.pop("drafter eager", 0)
        where = f"  {r['method']} (batch {r['batch']}): "
        if tally:  # one-off work a longer run would not pay per call: see time_methods
            moved.append(where + str(tally))
        if steps:  # paid again by every call (e.g. a prompt-wide update with no captured shape): not a one-off
            eager.append(where + f"{steps} in {r['inputs']} calls")
    if moved:
        lines += ["captured or rebuilt inside timed calls:", *moved]
    if eager:
        lines += ["drafter steps run eagerly inside timed calls (by design, every call pays them):", *eager]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--data")
    ap.add_argument("--gptfast", default=None, help="anchors folder (holding gptfast/); no gpt-fast rows without")
    for key in ("eagle2", "eagle3", "peagle", "dflash", "dspark", "medusa"):
        ap.add_argument(f"--{key}", default=None, help=f"{key} head folder (specdec.formats loader)")
    ap.add_argument("--num-prompts", type=int, default=30)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-k", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--lookup-k", type=int, default=10)
    ap.add_argument("--batches", type=int, nargs="*", default=[4, 16],
                    help="batched rows (besides batch 1); none: batch 1 only")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=None, help="budget of each timed loop")
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny random models, no gpt-fast")
    ap.add_argument("--compile", action="store_true",
                    help='also rows with generate(fast="compile") (torch.compile before each capture)')
    ap.add_argument("--only", nargs="+", default=None, help="keep only the specdec rows whose name holds one of these")
    ap.add_argument("--skip", nargs="+", default=None, help="drop the specdec rows whose name holds one of these")
    ap.add_argument("--parallel-tree", default=None,
                    help="also rows of P-EAGLE / DFlash / DSpark verifying this level-wise tree (a specdec.trees "
                         "preset, e.g. mc_sim_7b_63) instead of their chain")
    ap.add_argument("--chain-k", type=int, nargs="+", default=None,
                    help="also rows of P-EAGLE / DFlash / DSpark verifying chains of these lengths")
    ap.add_argument("--prefetch-rows", action="store_true",
                    help="also rows of P-EAGLE / DFlash / DSpark with GraphedDrafter.prefetch on")
    ap.add_argument("--fp8-heads", action="store_true",
                    help="also a row per EAGLE head rounded to float8 (specdec.nn.quantize_fp8_)")
    ap.add_argument("--int4-heads", type=int, nargs="+", default=None, choices=(32, 64, 128),
                    help="also a row per EAGLE head and group size on 4-bit weights (specdec.nn.quantize_int4_)")
    ap.add_argument("--out", default="runs/bench_fast")
    add_kernel_args(ap)
    args = ap.parse_args(argv)
    with kernels_for(args):
        return run_bench(ap, args)


def add_kernel_args(ap) -> None:
    """``--decode-kernels [all|ops|none]``: the fused decoder's decode kernels for the run (:func:`specdec.fused.
    decode_kernels`): ``all`` (the flag alone) the split-key attention and the fused element-wise ops, ``ops`` the
    element-wise ops only, ``none`` neither; without the flag, the library's defaults. ``--tree-attention on|off``:
    forwards of a few tokens under a mask (verification, the EAGLE heads' levels) on
    :func:`specdec.kernels.tree_attention` or SDPA; without it, the library's default. ``--blas cublaslt|cublas|
    torch``: the BLAS library captured steps pick their GEMMs from (:func:`specdec.graphs.use_capture_blas`).
    ``--skinny-rows N``: the most rows a projection runs on :func:`specdec.kernels.linear_skinny` (0: never)."""
    from specdec.graphs import CAPTURE_BLAS_CHOICES

    ap.add_argument("--decode-kernels", nargs="?", const="all", default=None, choices=["all", "ops", "none"],
                    help="the fused decoder's decode kernels: all (attention + element-wise ops), ops, none")
    ap.add_argument("--tree-attention", default=None, choices=["on", "off"],
                    help="tree verification and EAGLE levels on the tree-attention kernel (on) or SDPA (off)")
    ap.add_argument("--blas", default=None, choices=CAPTURE_BLAS_CHOICES,
                    help="the BLAS library captured steps pick GEMMs from (default: the library's, cublaslt)")
    ap.add_argument("--skinny-rows", type=int, default=None,
                    help="the most rows a projection runs on the tensor-core skinny kernel (0: never; default 16)")


def kernels_for(args):
    """The context a script's run goes in: :func:`specdec.fused.decode_kernels` as ``--decode-kernels`` asks."""
    from specdec.fused import decode_kernels

    choice, tree = getattr(args, "decode_kernels", None), getattr(args, "tree_attention", None)
    blas, skinny = getattr(args, "blas", None), getattr(args, "skinny_rows", None)
    if choice is None and tree is None and blas is None and skinny is None:
        return contextlib.nullcontext()
    settings = {} if choice is None else dict(attention=choice == "all", fused_ops=choice in ("all", "ops"))
    if tree is not None:
        settings["tree_attention"] = tree == "on"
    return decode_kernels(blas=blas, skinny_rows=skinny, **settings)


def run_bench(ap, args) -> dict:
    """The benchmark (see the module's docstring) for parsed ``args``."""
    torch.backends.cuda.enable_cudnn_sdp(False)  # the anchor's setting
    os.makedirs(args.out, exist_ok=True)
    errors: dict = {}
    if args.quick:
        device, dtype = "cpu", torch.float32
        target, draft, heads = quick_models(device)
        prompts = quick_prompts(args.num_prompts, args.prompt_tokens, device)
        name = "tiny random Llama (quick)"
    else:
        import transformers

        if not (args.target and args.data):
            ap.error("--target and --data are required (or --quick)")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        load = dict(dtype=dtype, attn_implementation="sdpa")
        target = transformers.AutoModelForCausalLM.from_pretrained(args.target, **load).to(device).eval()
        draft = (transformers.AutoModelForCausalLM.from_pretrained(args.draft, **load).to(device).eval()
                 if args.draft else None)
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.target)
        prompts = load_prompts(args.data, tokenizer, args.num_prompts, args.prompt_tokens, device)
        heads = load_heads(args, target, device, dtype)
        name = os.path.basename(args.target.rstrip("/"))
    n = args.max_new_tokens
    if not prompts:
        raise SystemExit(f"no prompt has {args.prompt_tokens} tokens: lower --prompt-tokens")
    print(f"{len(prompts)} prompts of {args.prompt_tokens} tokens", flush=True)

    # 1. Batch 1: every method, interleaved per prompt.
    methods = {"HF vanilla": hf_vanilla(target, n)}
    t0 = time.perf_counter()
    if args.gptfast and not args.quick:
        try:
            methods.update(gptfast_methods(args.gptfast, target, draft, args.draft_k, n, device, dtype))
        except Exception as err:  # recorded; specdec rows still run
            errors["gpt-fast setup"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    methods.update(specdec_methods(target, draft, heads, args, errors))
    timing = {}
    timed = time_methods(methods, prompts, warmup=args.warmup, max_seconds=args.max_seconds, device=device,
                         errors=errors, label="batch 1", target=target, timing=timing)
    rows = summarise(timed, batch=1, timing=timing)
    warm_s = time.perf_counter() - t0
    with open(os.path.join(args.out, "batch1.json"), "w") as f:  # kept if a later part runs out of time
        json.dump({"rows": rows, "errors": errors}, f, indent=1)
    print(short_table(rows), flush=True)

    # 2. Batches of different prompts, left-padded: HF vanilla, eager / fast plain, fast EAGLE-3.
    for batch in args.batches:
        groups = [torch.stack(prompts[i:i + batch]) for i in range(0, len(prompts) - batch + 1, batch)]
        if not groups:
            errors[f"batch {batch}"] = f"needs at least {batch} prompts, have {len(prompts)}"
            continue
        batched = {"HF vanilla": hf_vanilla(target, n),
                   "specdec eager plain": specdec_run(target, None, n, fast=False),
                   "specdec fast plain": specdec_run(target, None, n, fast=True)}
        if "eagle3" in heads:
            try:
                batched["specdec fast EAGLE-3"] = specdec_run(target, sd.recipes.eagle3(heads["eagle3"]), n,
                                                              fast=True)
            except Exception as err:
                errors[f"batch {batch} specdec fast EAGLE-3"] = f"{type(err).__name__}: {err}"
        timing_b = {}
        timed_b = time_methods(batched, groups, warmup=min(args.warmup, 1), max_seconds=args.max_seconds,
                               device=device, errors=errors, label=f"batch {batch}", target=target, timing=timing_b)
        rows += summarise(timed_b, batch=batch, timing=timing_b)

    # 3. Where the time of a fast EAGLE-3 step goes, with the Triton kernels and with their torch references
    # (issue 12's in-run comparison); and of a fast plain step.
    phases = None
    if "specdec fast EAGLE-3" in timed:
        phases = {}
        for mode in ("auto", "torch"):
            try:
                with sd.kernels.kernel_mode(mode):
                    phases["kernels" if mode == "auto" else "torch references"] = eagle3_phases(
                        methods["specdec fast EAGLE-3"].drafter, target, prompts[:3], n)
            except Exception as err:
                errors[f"EAGLE-3 phases ({mode})"] = f"{type(err).__name__}: {err}"
                traceback.print_exc()
    if device == "cuda":
        anatomy = []
        for fast in (True, "compile") if args.compile else (True,):
            try:
                anatomy.append(plain_anatomy(target, prompts[0], n, fast))
            except Exception as err:
                errors[f"plain anatomy ({fast})"] = f"{type(err).__name__}: {err}"
                traceback.print_exc()
        phases = dict(phases or {}, plain_anatomy=anatomy)

    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    meta = dict(title=f"{name}, {str(dtype).replace('torch.', '')}, greedy, {prompt_count(rows, len(prompts))} cut to "
                      f"their last {args.prompt_tokens} tokens, {n} new tokens (no EOS stop), cuDNN SDPA off, {gpu}",
                batch_note="gpt-fast's generate decodes one prompt at a time here (batch 1 only): batched rows "
                           "compare specdec with HF.",
                torch=torch.__version__, transformers=__import__("transformers").__version__, args=vars(args),
                seconds=round(time.perf_counter() - t0, 1), batch1_seconds=round(warm_s, 1), pdl=pdl_enabled())
    notes = checks(rows)
    md = to_markdown(rows, meta, phases, notes, errors)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "checks": notes, "eagle3_phases": phases, "errors": errors}, f,
                  indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    try:
        plot(rows, os.path.join(args.out, "results.png"), meta["title"])
    except ImportError as err:  # matplotlib is optional
        print(f"no plot: {err}")
    print(md)
    print(short_table(rows))
    return {"rows": rows, "checks": notes, "phases": phases, "errors": errors}


if __name__ == "__main__":
    main()
