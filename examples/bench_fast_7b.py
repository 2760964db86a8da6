"""The fast path on a Llama-2-7B shape (random weights, nothing downloaded): one step, eager against fast.

For batch 1, 4 and 16 (``--batches``), on a prompt of ``--context`` random tokens, the script times (median of
``--reps`` runs after ``--warmup``, each run between two CUDA events and followed by a synchronisation, so the
figure is the step's wall time):

- ``hf_eager``: one HF forward of one token per row on a ``DynamicCache`` (what HF ``generate`` runs per token,
  without its logits processing);
- ``eager_plain`` / ``fast_plain``: one :func:`specdec.step.step` without drafts, on
  :class:`~specdec.adapter.ModelAdapter` / on :class:`~specdec.static.StaticAdapter` (the fast path);
  ``fast_plain_cublas``: the fast plain step with the one-row linear kernel off; ``fast_plain_attn``: with the
  split-key attention kernel on; ``fast_plain_ops``: with the fused element-wise ops on (attention by SDPA);
  ``fast_plain_kernels``: with every decode kernel on (attention and the fused
  element-wise ops too; :func:`specdec.fused.decode_kernels`);
- ``floor``: the bandwidth floor of one vanilla step: (weight bytes + KV bytes of the context) / the copy bandwidth
  measured here (a large device-to-device copy);
- ``gptfast`` (with ``--gptfast PATH``, the anchors folder holding ``gptfast/``): gpt-fast's compiled decode step
  (``torch.compile(mode="reduce-overhead")``, static cache) on the same shape, in the same process (about two
  minutes of compiling per batch size on the H200; gpt-fast's module sets inductor options at import);
- ``fast_plain_compiled`` / ``fast_spec_compiled`` (with ``--compile``): the same with ``torch.compile`` applied
  before each capture (:func:`specdec.static.compiled_capture`; minutes of compiling per shape), the target's
  forwards and (since session 13, as ``generate(fast="compile")`` does) the drafter's steps;
- ``eager_spec`` / ``fast_spec``: one speculative step, EAGLE-2 (a random :class:`~specdec.heads.Eagle1Head`,
  ``DynamicTree(60, 6, 10)``, drafter graphed as ``recipes.eagle2`` delivers it), verifying the 61-node tree, with
  compaction, on each adapter; ``fast_spec_kernels``: the fast one with the fused element-wise ops on. The fast
  rows run ``step(..., sync=False)`` as ``generate()`` does (since session 9: the speculative step is then one
  captured forward + verification + late commit; before, these rows timed the synchronous step).
- ``fast_spec_fr``: ``fast_spec`` with the head's ``lm_head`` cut to ``--draft-vocab`` target ids
  (:meth:`~specdec.heads.Eagle1Head.restrict_vocab`, FR-Spec; lossless, the drafts may differ);
  ``fast_spec_fr8``: the same head with its linears and ``lm_head`` rounded to float8
  (:func:`specdec.nn.quantize_fp8_`: half the bytes per head forward; lossless, the drafts may differ);
  ``fast_spec_fr4``: the same head on 4-bit weights, ``--int4-group`` inputs per scale
  (:func:`specdec.nn.quantize_int4_`: a quarter of the bytes; lossless, the drafts differ more).

``--blas`` picks the BLAS library the captured steps take their GEMMs from (:func:`specdec.graphs.use_capture_blas`;
default the library's, cuBLASLt); ``--skinny-rows`` the most rows a projection runs on the tensor-core skinny kernel
(:func:`specdec.kernels.linear_skinny`: the head's tree levels and updates; 0 turns it off); past it, up to 64 rows
(the verify forward), each projection runs whichever of ``F.linear`` and the skinny kernel was faster when timed on
the card (:mod:`specdec.kernels.tuning`; the picks are printed and kept in ``results.json``), or ``F.linear`` with
``--no-tune-linears``.

``--ragged`` gives the rows prompts of different lengths, left-padded (row ``i`` holds ``context - i * context /
(2 * batch)`` real tokens): the fast path's ragged batches (tree attention's ``kv_start``) instead of dense ones.

``--queued N`` times N steps queued back to back per run (no sync between, as ``generate()`` queues them) and
reports the time / N: the step inside a decoding loop, where the host's launches for the next step overlap the
device's work. The default (1) times each step alone, from an idle device.

Every measurement runs in its own ``try``: a failure is recorded in the results instead of ending the run. Prints a
Markdown table; ``--out DIR`` writes ``results.json`` and ``results.md``.

Examples::

    python examples/bench_fast_7b.py --out runs/fast_7b                                   # on the H200
    python examples/bench_fast_7b.py --gptfast shared/anchors --out runs/fast_7b          # with gpt-fast beside
    python examples/bench_fast_7b.py --tiny --batches 1 2 --reps 3                        # any machine, tiny shape
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specdec import recipes  # noqa: E402
from specdec.adapter import ModelAdapter  # noqa: E402
from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.fused import decode_kernels, decode_settings  # noqa: E402
from specdec.graphs import (  # noqa: E402
    CAPTURE_BLAS_CHOICES,
    GraphedDrafter,
    capture_blas,
    capture_graph,
    capture_graph_ref,
)
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.kernels import pdl_enabled  # noqa: E402
from specdec.kernels.tuning import linear_picks  # noqa: E402
from specdec.nn import quantize_fp8_, quantize_int4_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for, compiled_capture  # noqa: E402
from specdec.step import prefill, step  # noqa: E402
from specdec.trees.dynamic import DynamicTree  # noqa: E402

LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048)
TREE = dict(total_tokens=60, depth=6, top_k=10)


def build_target(shape: dict, device: str, dtype: torch.dtype):
    """A random-weight ``LlamaForCausalLM`` of the given shape, built on ``device`` (sdpa attention)."""
    import transformers

    config = transformers.LlamaConfig(**shape)
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():  # cheap, in place, on the device; small std keeps bf16 logits finite
            p.normal_(0.0, 0.02)
    return model.eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, *, warmup: int, reps: int, device: str, queued: int = 1) -> float:
    """Median milliseconds of ``fn()`` (CUDA events on CUDA, each run followed by a sync; wall clock elsewhere).

    ``queued > 1``: each run calls ``fn()`` that many times back to back (no sync between, as a decoding loop queues
    its steps) and counts the elapsed time / ``queued``: the step's time in a loop, where the host's launches for
    the next step overlap the device's work on the last one. ``queued = 1``: the step alone, from an idle device."""
    import time

    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(queued):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / queued)
        else:
            t = time.perf_counter()
            for _ in range(queued):
                fn()
            times.append(1e3 * (time.perf_counter() - t) / queued)
    return statistics.median(times)


def copy_bandwidth(device: str, gigabytes: float = 2.0) -> float:
    """Measured device copy bandwidth in bytes/s (read + write of a ``gigabytes`` buffer)."""
    n = int(gigabytes * 1e9) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=3, reps=10, device=device)
    return 2 * n * 2 / (ms * 1e-3)


def floor_ms(model, batch: int, context: int, bandwidth: float) -> float:
    """(weight bytes + KV-cache bytes of ``context`` tokens per row) / bandwidth, in ms."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * batch * c.num_key_value_heads * context * head_dim * model.dtype.itemsize
    return 1e3 * (weights + kv) / bandwidth


def hf_eager_step(model, ids):
    """A closure running one HF decode forward (one token per row) on a growing ``DynamicCache``."""
    import inspect

    from transformers import DynamicCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache()
    B, T = ids.shape
    with torch.no_grad():
        model(input_ids=ids, **{kw: cache}, use_cache=True)
    tok = ids[:, -1:].clone()
    pos = [T]

    @torch.no_grad()
    def run():
        model(input_ids=tok, position_ids=torch.full((B, 1), pos[0], device=ids.device), **{kw: cache},
              use_cache=True)
        pos[0] += 1
    return run


def ragged_mask(batch: int, context: int, device: str) -> torch.Tensor:
    """``[batch, context]`` attention mask of left-padded prompts: row ``i`` holds ``context - i * (context //
    (2 * batch))`` real tokens (the last row about half the context)."""
    real = torch.tensor([context - i * (context // (2 * batch)) for i in range(batch)], device=device)
    return (torch.arange(context, device=device)[None, :] >= (context - real)[:, None]).long()


def specdec_step(adapter, ids, drafter=None, num_drafts: int = 0, sync: bool = True, mask=None):
    """A closure running one :func:`specdec.step.step` from a live state (which it advances). ``sync=False`` is what
    ``generate()`` runs on the fast path: no host sync inside the step (a greedy step with drafts is then one
    captured forward + verification + commit, :meth:`~specdec.static.StaticAdapter.forward_commit`). ``mask``: the
    prompts' ``[B, T]`` attention mask (left padding; ``None``: none)."""
    out = prefill(adapter, ids, mask, drafter=drafter)
    state = [out.state]

    def run():
        state[0] = step(adapter, state[0], drafter=drafter, num_drafts=num_drafts, sync=sync).state
    return run


def gptfast_step(path: str, shape: dict, batch: int, context: int, device: str, dtype: torch.dtype):
    """A closure running gpt-fast's compiled decode step (reduce-overhead, static cache) on the same shape."""
    folder = path if os.path.exists(os.path.join(path, "model.py")) else os.path.join(path, "gptfast")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import generate as G
    from model import ModelArgs, Transformer

    args = ModelArgs(block_size=shape["max_position_embeddings"], vocab_size=shape["vocab_size"],
                     n_layer=shape["num_hidden_layers"], n_head=shape["num_attention_heads"],
                     n_local_heads=shape["num_key_value_heads"], dim=shape["hidden_size"],
                     intermediate_size=shape["intermediate_size"])
    with torch.device(device):
        model = Transformer(args).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.eval()
    with torch.device(device):
        model.setup_caches(max_batch_size=batch, max_seq_length=context + 64)
    decode = torch.compile(G.decode_one_token, mode="reduce-overhead", fullgraph=True)
    tok = torch.zeros(batch, 1, dtype=torch.int, device=device)
    pos = torch.tensor([context], dtype=torch.int, device=device)

    @torch.no_grad()
    def run():
        decode(model, tok, pos.clone(), temperature=0.0)
    return run, model


def measure(results: dict, name: str, make, *, warmup: int, reps: int, device: str, only=None,
            queued: int = 1) -> None:
    """``results[name] = median ms`` of the closure ``make()`` returns (``queued``: see :func:`time_ms`), or the
    error it raised (nothing when ``only`` is given and does not name it)."""
    if only and name not in only:
        return
    try:
        fn = make()
        results[name] = round(time_ms(fn, warmup=warmup, reps=reps, device=device, queued=queued), 4)
    except Exception as err:  # a benchmark records failures instead of dying
        results[name] = None
        results.setdefault("errors", {})[name] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()


COLUMNS = ["hf_eager", "eager_plain", "fast_plain", "fast_plain_cublas", "fast_plain_attn", "fast_plain_ops",
           "fast_plain_kernels",
           "fast_plain_compiled", "floor", "gptfast", "eager_spec", "fast_spec", "fast_spec_kernels",
           "fast_spec_compiled", "fast_spec_fr", "fast_spec_fr8", "fast_spec_fr4"]


def to_markdown(rows: dict, meta: dict) -> str:
    """The results as a Markdown table (ms per step; ratios last)."""
    head = ["batch"] + [f"{c} ms" for c in COLUMNS] + ["fast_plain / floor", "fast_spec / fast_plain",
                                                         "fast_spec_fr / fast_plain", "fast_spec_fr8 / fast_plain",
                                                         "fast_spec_fr4 / fast_plain", "eager_plain / fast_plain"]
    lines = [f"{meta['shape_name']} shape, random weights, {meta['dtype']}, context {meta['context']}, "
             f"EAGLE-2 tree {TREE}; copy bandwidth {meta['bandwidth_TBps']:.2f} TB/s; "
             f"{meta.get('queued', 1)} step(s) queued per timed run; fast_spec_fr: draft vocabulary "
             f"{meta.get('draft_vocab')}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    for batch, r in rows.items():
        cells = [str(batch)] + [f"{r[c]:.2f}" if r.get(c) else "-" for c in COLUMNS]
        cells += [ratio(r.get("fast_plain"), r.get("floor")), ratio(r.get("fast_spec"), r.get("fast_plain")),
                  ratio(r.get("fast_spec_fr"), r.get("fast_plain")), ratio(r.get("fast_spec_fr8"), r.get("fast_plain")),
                  ratio(r.get("fast_spec_fr4"), r.get("fast_plain")), ratio(r.get("eager_plain"), r.get("fast_plain"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bench_batch(model, head, drafter, batch: int, args, device: str, dtype: torch.dtype, bandwidth: float,
                fr_drafter=None, fr8_drafter=None, fr4_drafter=None) -> dict:
    """Every measurement at one batch size (ms per step; ``errors`` holds what failed)."""
    r = {}
    shape = TINY if args.tiny else LLAMA2_7B
    ids = torch.randint(0, shape["vocab_size"], (batch, args.context), device=device,
                        generator=torch.Generator(device=device).manual_seed(batch))
    kw = dict(warmup=args.warmup, reps=args.reps, device=device, only=args.only, queued=args.queued)
    # every specdec row on the same prompts (left-padded with --ragged)
    run_step = functools.partial(specdec_step, mask=ragged_mask(batch, args.context, device)
                                 if args.ragged and batch > 1 else None)
    # Each speculative step commits at most depth + 1 tokens (warm-up runs included).
    capacity = capacity_for(args.context, (args.warmup + args.reps * args.queued) * (TREE["depth"] + 1), 128)
    measure(r, "hf_eager", lambda: hf_eager_step(model, ids), **kw)
    measure(r, "eager_plain", lambda: run_step(ModelAdapter(model), ids), **kw)
    measure(r, "fast_plain", lambda: run_step(StaticAdapter(model, capacity=capacity), ids, sync=False), **kw)
    with decode_kernels(gemv_rows=0):  # the same with cuBLAS for every projection (the one-row kernel off)
        measure(r, "fast_plain_cublas", lambda: run_step(StaticAdapter(model, capacity=capacity), ids,
                                                         sync=False), **kw)
    with decode_kernels(attention=True):  # + the split-key attention kernel
        measure(r, "fast_plain_attn", lambda: run_step(StaticAdapter(model, capacity=capacity), ids,
                                                       sync=False), **kw)
    with decode_kernels(fused_ops=True):  # the fused element-wise ops alone (SDPA's attention)
        measure(r, "fast_plain_ops", lambda: run_step(StaticAdapter(model, capacity=capacity), ids,
                                                      sync=False), **kw)
    with decode_kernels(attention=True, fused_ops=True):  # + the fused element-wise ops: every decode kernel
        measure(r, "fast_plain_kernels", lambda: run_step(StaticAdapter(model, capacity=capacity), ids,
                                                          sync=False), **kw)
    r["floor"] = round(floor_ms(model, batch, args.context, bandwidth), 4)
    if args.gptfast and (args.gptfast_batches is None or batch in args.gptfast_batches):
        held = {}

        def make_gptfast():
            fn, held["model"] = gptfast_step(args.gptfast, shape, batch, args.context, device, dtype)
            return fn
        measure(r, "gptfast", make_gptfast, **kw)
        held.clear()
    layers = head.feature_layers
    measure(r, "eager_spec", lambda: run_step(ModelAdapter(model, layers), ids, drafter, TREE["depth"]), **kw)
    measure(r, "fast_spec", lambda: run_step(StaticAdapter(model, layers, capacity=capacity), ids, drafter,
                                             TREE["depth"], sync=False), **kw)
    with decode_kernels(fused_ops=True):  # the verify forward's element-wise ops fused (its 61 tokens: no GEMV)
        measure(r, "fast_spec_kernels", lambda: run_step(StaticAdapter(model, layers, capacity=capacity), ids,
                                                         drafter, TREE["depth"], sync=False), **kw)
    if fr_drafter is not None:  # FR-Spec: the head's lm_head over a subset of the vocabulary (lossless)
        measure(r, "fast_spec_fr", lambda: run_step(StaticAdapter(model, layers, capacity=capacity), ids,
                                                    fr_drafter, TREE["depth"], sync=False), **kw)
    for column, rounded in (("fast_spec_fr8", fr8_drafter), ("fast_spec_fr4", fr4_drafter)):
        if rounded is not None:  # the FR-Spec head rounded to float8 / 4 bits (lossless)
            measure(r, column, lambda rounded=rounded: run_step(StaticAdapter(model, layers, capacity=capacity), ids,
                                                                rounded, TREE["depth"], sync=False), **kw)
    if args.compile and (args.compile_batches is None or batch in args.compile_batches):
        cap = compiled_capture(capture_graph if device == "cuda" else
                               (lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=1)))
        measure(r, "fast_plain_compiled", lambda: run_step(StaticAdapter(model, capacity=capacity, capture=cap),
                                                           ids, sync=False), **kw)
        # the drafter's steps compiled too, as generate(fast="compile") runs them
        compiled_drafter = GraphedDrafter(EagleDrafter(head, DynamicTree(**TREE)), capture=cap)
        measure(r, "fast_spec_compiled", lambda: run_step(
            StaticAdapter(model, layers, capacity=capacity, capture=cap), ids, compiled_drafter, TREE["depth"],
            sync=False), **kw)
    return r


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per row")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--queued", type=int, default=1,
                        help="steps queued back to back per timed run (1: each step alone from an idle device)")
    parser.add_argument("--draft-vocab", type=int, default=8192,
                        help="fast_spec_fr: the head drafts over this many target ids (FR-Spec; 0: skip the row)")
    parser.add_argument("--int4-group", type=int, default=128, choices=(32, 64, 128),
                        help="inputs per scale of fast_spec_fr4's 4-bit head (named in --only to run it)")
    parser.add_argument("--eagle-fold", action="store_true",
                        help="EAGLE-2 drafters built with EagleDrafter(fold=True): update + next draft in the verify "
                        "graph")
    parser.add_argument("--gptfast", default=None, help="anchors folder (holding gptfast/) to time gpt-fast too")
    parser.add_argument("--compile", action="store_true",
                        help="also time the fast path with torch.compile before capture (minutes of compiling)")
    parser.add_argument("--gptfast-batches", type=int, nargs="+", default=None,
                        help="time gpt-fast at these batch sizes only (default: every one of --batches)")
    parser.add_argument("--compile-batches", type=int, nargs="+", default=None,
                        help="with --compile, compile at these batch sizes only (default: every one of --batches)")
    parser.add_argument("--only", nargs="+", choices=[c for c in COLUMNS if c != "floor"], default=None,
                        help="time these rows only (default: every row)")
    parser.add_argument("--blas", default=None, choices=CAPTURE_BLAS_CHOICES,
                        help="the BLAS library captured steps pick GEMMs from (default: the library's, cublaslt)")
    parser.add_argument("--skinny-rows", type=int, default=None,
                        help="the most rows a projection runs on the tensor-core skinny kernel (0: never; default 16)")
    parser.add_argument("--no-tune-linears", action="store_true",
                        help="verify forwards past --skinny-rows keep F.linear instead of timing it against the "
                             "skinny kernel (specdec.kernels.tuning)")
    parser.add_argument("--ragged", action="store_true",
                        help="left-padded prompts of different lengths (row i: context - i * context / (2 batch))")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape (smoke test on any machine)")
    parser.add_argument("--out", default=None, help="folder for results.json / results.md")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = TINY if args.tiny else LLAMA2_7B
    torch.manual_seed(0)
    model = build_target(shape, device, dtype)
    bandwidth = copy_bandwidth(device, 0.05 if args.tiny else 2.0)
    meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", dtype=str(dtype),
                context=args.context, shape=shape, shape_name="tiny" if args.tiny else "Llama-2-7B", tree=TREE,
                torch=torch.__version__, transformers=__import__("transformers").__version__,
                bandwidth_TBps=bandwidth / 1e12, warmup=args.warmup, reps=args.reps, queued=args.queued,
                draft_vocab=args.draft_vocab, blas=args.blas or capture_blas(), pdl=pdl_enabled(), ragged=args.ragged,
                eagle_fold=args.eagle_fold)
    tune = False if args.no_tune_linears else None
    with decode_kernels(skinny_rows=args.skinny_rows, tune_linears=tune):
        meta["skinny_rows"] = decode_settings()["skinny_rows"]
        meta["tune_linears"] = decode_settings()["tune_linears"]
    torch.manual_seed(1)
    head = Eagle1Head.from_target(model)

    def eagle2(h):  # --eagle-fold: the update and the next draft inside the verify step's graph (one replay a step)
        return GraphedDrafter(EagleDrafter(h, DynamicTree(**TREE), fold=True)) if args.eagle_fold else \
            recipes.eagle2(h, **TREE)
    drafter = eagle2(head)
    fr_drafter = fr8_drafter = fr4_drafter = None
    V = shape["vocab_size"]
    # the same head's weights, its lm_head cut to draft_vocab random ids (which ids does not change the time)
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:min(args.draft_vocab, V)].sort().values
    if args.draft_vocab and (not args.only or "fast_spec_fr" in args.only):
        fr_head = Eagle1Head.from_target(model, draft_vocab=kept)
        fr_head.load_state_dict(head.state_dict())
        fr_drafter = eagle2(fr_head)
    if args.draft_vocab and (not args.only or "fast_spec_fr8" in args.only):
        fr8_head = Eagle1Head.from_target(model, draft_vocab=kept)
        fr8_head.load_state_dict(head.state_dict())
        fr8_drafter = eagle2(quantize_fp8_(fr8_head.eval().requires_grad_(False)))
    if args.draft_vocab and args.only and "fast_spec_fr4" in args.only:  # asked for by name only
        fr4_head = Eagle1Head.from_target(model, draft_vocab=kept)
        fr4_head.load_state_dict(head.state_dict())
        fr4_drafter = eagle2(quantize_int4_(fr4_head.eval().requires_grad_(False), group=args.int4_group))
    rows = {}
    with decode_kernels(blas=args.blas, skinny_rows=args.skinny_rows, tune_linears=tune):
        for batch in args.batches:
            rows[batch] = bench_batch(model, head, drafter, batch, args, device, dtype, bandwidth, fr_drafter,
                                      fr8_drafter, fr4_drafter)
            print(f"batch {batch}: {json.dumps(rows[batch])}", flush=True)
    meta["linear_picks"] = {f"rows={key[2]} [{key[3]}, {key[4]}] {key[5]}": None if pick is None else list(pick)
                            for key, pick in linear_picks().items()}  # None: F.linear
    print(f"linear picks: {json.dumps(meta['linear_picks'])}", flush=True)
    table = to_markdown(rows, meta)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(table)
    return rows


if __name__ == "__main__":
    main()
