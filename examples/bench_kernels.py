"""Benchmark every specdec.kernels op against its torch reference: median time and achieved bandwidth.

For each op, at batch 1, 8 and 64 (vocabulary 8192 and 152064 for the verifiers; trees and chains of 60 draft
nodes), the script times the Triton kernel and the torch reference with CUDA events (median of ``--reps`` runs
after ``--warmup``), checks that both give the same result, and reports the bandwidth the kernel achieves: the
bytes an ideal implementation must move (listed per op below) over its median time, against the H200's measured
~4.3 TB/s. It prints a table and writes ``bench_kernels.json`` and ``bench_kernels.md`` to ``--out``.

Bytes counted (reads + writes of the data the op needs, at the dtypes used here):

- ``tree_mask``: the mask (``B * M * Lc_aligned`` bf16) + committed_valid + parents.
- ``head_tree_mask``: the bool mask ``B * F * C`` + visible ``B * F * S`` + lengths.
- ``emitted_tokens``: the path and the output (``B * (D + 1)`` int64 each), the gathered tokens, the counts.
- ``accepted_feedback``: the emitted tokens read, four ``B * W`` outputs written (three int64, one bool).
- ``accepted_feedback+features``: the same, plus three bf16 feature layers gathered at the accepted nodes
  (``B * W * H`` read and written each) and the node indices.
- ``verify_greedy``: the logits ``B * (N + 1) * V`` (bf16).
- ``verify_chain_noise``: per row the target and draft rows at the first rejection (fp32) and the exponentials
  (fp64): ``B * V * 16`` (+ the per-node gathers).
- ``verify_tree_deterministic_noise``: the target row at the last accepted node and the exponentials:
  ``B * V * 12`` (+ gathers).
- ``compact_kv`` (copy): every layer's keys and values, ``Lc + A`` slots read and written; (inplace): ``A`` slots.
- ``parallel_draft_inputs``: features read, hidden states written (bf16).
- ``tree_attention``: one layer's keys and values (``B * 4 h_kv * S * d`` bf16 each), the queries and the output,
  the mask (``B * M * S`` bf16). Compared within 0.02 (bf16 rounding of the probabilities), not exactly.
- ``topk_rows``: the ``[10 B, V]`` float32 rows.

Examples::

    python examples/bench_kernels.py --out runs/bench_kernels            # on the H200
    python examples/bench_kernels.py --quick --out /tmp/bk               # tiny shapes, any machine (CPU: reference
                                                                         # only, or interpreted kernels with
                                                                         # TRITON_INTERPRET=1)
    python examples/bench_kernels.py --compile-only 90                   # compile every kernel for sm_90, no GPU
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specdec import kernels as K  # noqa: E402
from specdec.kernels import _dispatch  # noqa: E402
from specdec.types import Draft, DraftScheme  # noqa: E402

PEAK_TBPS = 4.3  # measured copy bandwidth of the H200 (TB/s)


class Shapes(NamedTuple):
    batches: tuple[int, ...]
    vocabs: tuple[int, ...]
    nodes: int  # draft nodes of trees and chains
    prefix: int  # committed cache slots
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    parallel_drafts: int
    accepted: int  # kept slots per row in compact_kv


FULL = Shapes((1, 8, 64), (8192, 152064), 60, 1024, 32, 8, 128, 4096, 8, 6)
QUICK = Shapes((3,), (257,), 6, 20, 2, 2, 16, 64, 3, 3)


class Case(NamedTuple):
    op: str
    batch: int
    vocab: int | None
    run: Callable[[], object]
    bytes: int
    note: str
    atol: float = 0.0  # 0: the kernel must equal the reference exactly; else within this (float rounding)


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


def random_tree_parents(seed: int, batch: int, nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Breadth-first random trees (EAGLE-2-like: a few children per node), different per row."""
    rng = random.Random(seed)
    parents = torch.full((batch, nodes + 1), -1, dtype=torch.long)
    depths = torch.zeros(batch, nodes + 1, dtype=torch.long)
    for b in range(batch):
        lowest = 0
        for i in range(1, nodes + 1):
            parent = max(lowest, rng.randrange(max(0, i - 6), i))
            parents[b, i], depths[b, i], lowest = parent, depths[b, parent] + 1, parent
    return parents, depths


def cases(shapes: Shapes, device: torch.device) -> list[Case]:
    """Every (op, batch, vocabulary) configuration, inputs built on ``device``."""
    g = torch.Generator().manual_seed(0)  # small inputs, on the CPU
    gd = torch.Generator(device).manual_seed(0)  # large ones, drawn where they live
    n = shapes.nodes
    out: list[Case] = []
    for batch in shapes.batches:
        # tree_mask: a 60-node tree (+ root) over `prefix` committed slots, bf16
        parents, depths = random_tree_parents(batch, batch, n)
        valid = (torch.rand(batch, shapes.prefix, generator=g) < 0.95).to(device)
        parents_d = parents.to(device)
        present = torch.ones(batch, n + 1, dtype=torch.bool, device=device)
        lengths = valid.sum(1)
        keys = -(-(shapes.prefix + n + 1) // 8) * 8
        mask_bytes = batch * (n + 1) * keys * 2 + batch * shapes.prefix + batch * (n + 1) * 8 * 2
        out.append(Case("tree_mask", batch, None,
                        lambda v=valid, p=parents_d, pr=present, le=lengths: K.tree_mask(v, p, pr, torch.bfloat16,
                                                                                      lengths=le),
                        mask_bytes, f"Lc={shapes.prefix}, M={n + 1}, bf16"))
        # head_tree_mask: an EAGLE-2 expansion level (top_k 10 frontier nodes, 5 levels of scratch) over the head's
        # fixed-capacity cache, bool (what EagleDrafter passes to its head)
        frontier, scratch = 10, 50
        capacity = -(-(shapes.prefix + scratch + 1) // 64) * 64
        visible = (torch.rand(batch, frontier, scratch, generator=g) < 0.2).to(device)
        head_lengths = torch.randint(1, shapes.prefix + 1, (batch,), generator=g).to(device)
        out.append(Case("head_tree_mask", batch, None,
                        lambda le=head_lengths, vi=visible, c=capacity: K.head_tree_mask(le, vi, shapes.prefix, c,
                                                                                      torch.bool),
                        batch * frontier * (capacity + scratch) + batch * 8,
                        f"S0={shapes.prefix}, F={frontier}, S={scratch}, C={capacity}, bool"))
        # emitted_tokens: a 60-node draft, paths of up to 8 accepted drafts (D + 1 = 9 columns), int64
        draft_tokens = torch.randint(0, 8192, (batch, n), generator=g).to(device)
        accepted = torch.randint(0, min(8, n) + 1, (batch,), generator=g)
        path = torch.full((batch, 9), -1, dtype=torch.long)
        path[:, 0] = 0
        for b in range(batch):
            path[b, 1:1 + int(accepted[b])] = torch.randperm(n, generator=g)[:int(accepted[b])] + 1
        bonus = torch.randint(0, 8192, (batch,), generator=g).to(device)
        out.append(Case("emitted_tokens", batch, None,
                        lambda t=draft_tokens, p=path.to(device), a=accepted.to(device), x=bonus:
                        K.emitted_tokens(t, p, a, x),
                        batch * (9 * 8 * 3 + 8 * 3), f"N={n}, D+1=9, int64"))
        # accepted_feedback: the drafter's feedback rows from the emitted tokens (D + 1 = 9 columns, all kept)
        emitted, counts = K.emitted_tokens_ref(draft_tokens, path.to(device), accepted.to(device), bonus)
        out.append(Case("accepted_feedback", batch, None,
                        lambda e=emitted, c=counts, r=bonus: K.accepted_feedback(r, e, c, c, 9),
                        batch * (9 * 8 * 4 + 9 + 8 * 3), "D+1=9, W=9, int64"))
        # accepted_feedback with EAGLE-3's three target layers (bf16, hidden = shapes.hidden) at the accepted nodes
        features = [torch.randn(batch, n + 1, shapes.hidden, generator=gd, device=device, dtype=torch.bfloat16)
                    for _ in range(3)]
        out.append(Case("accepted_feedback+features", batch, None,
                        lambda e=emitted, c=counts, r=bonus, f=features, p=path.to(device):
                        K.accepted_feedback(r, e, c, c, 9, f, p),
                        batch * (9 * 8 * 4 + 9 + 8 * 3 + 3 * 9 * shapes.hidden * 2 * 2 + 9 * 8),
                        f"W=9, 3 layers, N+1={n + 1}, H={shapes.hidden}, bf16"))
        for vocab in shapes.vocabs:
            tree = Draft(torch.zeros(batch, n, dtype=torch.long), parents, depths, None, DraftScheme.DETERMINISTIC)
            logits = torch.randn(batch, n + 1, vocab, generator=gd, device=device)
            at_parent = logits.argmax(-1).cpu().gather(1, parents[:, 1:].clamp_min(0))
            tree = tree._replace(tokens=torch.where(torch.rand(batch, n, generator=g) < 0.9, at_parent, 0))
            depth = int(depths.max())
            tree_d = Draft(tree.tokens.to(device), parents_d, depths.to(device), None, tree.scheme)
            logits_d = logits.to(torch.bfloat16)
            out.append(Case("verify_greedy", batch, vocab,
                            lambda x=logits_d, d=tree_d, m=depth: K.verify_greedy(x, d, max_depth=m),
                            batch * (n + 1) * vocab * 2, f"tree N={n}, bf16 logits"))
            probs = torch.softmax(2 * logits, -1)
            noise = K.draw_verify_noise(torch.Generator(device).manual_seed(batch), batch, n, vocab, device)
            out.append(Case("verify_tree_deterministic_noise", batch, vocab,
                            lambda p=probs, d=tree_d, z=noise, m=depth: K.verify_tree_deterministic_noise(
                                p, d, *z, max_depth=m),
                            batch * vocab * 12 + batch * n * 24, f"tree N={n}, fp32 probs"))
            chain_parents = torch.arange(-1, n).expand(batch, -1).to(device)
            chain_depths = torch.arange(n + 1).expand(batch, -1).to(device)
            jitter = torch.randn(batch, n, vocab, generator=gd, device=device)
            draft_probs = torch.softmax(2 * logits[:, :n] + jitter, -1)
            chain_tokens = torch.where(torch.rand(batch, n, generator=g) < 0.9, probs[:, :n].argmax(-1).cpu(), 1)
            chain = Draft(chain_tokens.to(device), chain_parents, chain_depths, draft_probs, DraftScheme.IID)
            out.append(Case("verify_chain_noise", batch, vocab,
                            lambda p=probs, d=chain, z=noise: K.verify_chain_noise(p, d, *z, max_depth=n),
                            batch * vocab * 16 + batch * n * 24, f"chain K={n}, fp32 probs, sampled drafts"))
            del logits, draft_probs
        # compact_kv: every layer of a Llama-8B-like cache, rows keep different non-prefix paths
        length = shapes.prefix + n + 1
        cache = [torch.randn(batch, shapes.kv_heads, length, shapes.head_dim, generator=gd, device=device,
                             dtype=torch.bfloat16) for _ in range(2 * shapes.layers)]
        keep = torch.stack([torch.tensor([0] + sorted(random.Random(b).sample(range(1, n + 1), shapes.accepted - 1)))
                            for b in range(batch)]).to(device)
        counts = torch.full((batch,), shapes.accepted, device=device)
        per_slot = 2 * shapes.layers * batch * shapes.kv_heads * shapes.head_dim * 2
        kv_note = f"{shapes.layers} layers x {shapes.kv_heads} heads x {shapes.head_dim}, Lc={shapes.prefix}, " \
                  f"A={shapes.accepted}, bf16"
        out.append(Case("compact_kv", batch, None,
                        lambda c=cache, k=keep, ct=counts: K.compact_kv(c[: len(c) // 2], c[len(c) // 2:], k, ct,
                                                                        shapes.prefix),
                        2 * per_slot * (shapes.prefix + shapes.accepted), kv_note + ", copy"))
        out.append(Case("compact_kv_inplace", batch, None,
                        lambda c=cache, k=keep, ct=counts: K.compact_kv(c[: len(c) // 2], c[len(c) // 2:], k, ct,
                                                                        shapes.prefix, inplace=True),
                        2 * per_slot * shapes.accepted, kv_note + ", in place"))
        # parallel_draft_inputs: T = 61 verified slots, K drafts, hidden 4096
        width, k = n + 1, shapes.parallel_drafts
        tokens = torch.randint(1000, (batch, width), generator=g).to(device)
        features = torch.randn(batch, width, shapes.hidden, generator=gd, device=device, dtype=torch.bfloat16)
        num_valid = torch.randint(1, width + 1, (batch,), generator=g).to(device)
        nxt = torch.randint(1000, (batch,), generator=g).to(device)
        start = torch.randint(0, 500, (batch,), generator=g).to(device)
        mask_hidden = torch.randn(shapes.hidden, generator=g).to(device, torch.bfloat16)
        out.append(Case("parallel_draft_inputs", batch, None,
                        lambda a=(tokens, features, num_valid, nxt, start, mask_hidden), k=k: K.parallel_draft_inputs(
                            *a, num_drafts=k, mask_token_id=1001),
                        batch * (width + width + k - 1) * shapes.hidden * 2, f"T={width}, K={k}, H={shapes.hidden}"))
        # tree_attention: the verify forward's attention, one layer: 61 nodes (a bucket of 64) over the cache
        m = 64 if n >= 60 else n + 1  # FULL: the 61-node tree's bucket; QUICK: a small tree (the interpreter is slow)
        heads, slots = shapes.kv_heads * 4, -(-(shapes.prefix + m) // 64) * 64
        q = torch.randn(batch, heads, m, shapes.head_dim, generator=gd, device=device, dtype=torch.bfloat16)
        kv = [torch.randn(batch, heads, slots, shapes.head_dim, generator=gd, device=device, dtype=torch.bfloat16)
              for _ in range(2)]
        seen = torch.ones(batch, 1, m, slots, dtype=torch.bool, device=device)
        seen[..., shapes.prefix:] = False
        seen[..., shapes.prefix:shapes.prefix + m] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        amask = torch.zeros(seen.shape, dtype=torch.bfloat16, device=device).masked_fill_(~seen, -3e38)
        out.append(Case("tree_attention", batch, None, lambda a=(q, *kv, amask): K.tree_attention(*a),
                        2 * kv[0].numel() * 2 + 2 * q.numel() * 2 + amask.numel() * 2,
                        f"{heads} heads x {shapes.head_dim}, M={m}, S={slots}, bf16", atol=2e-2))
        # topk_rows: a dynamic tree's level, k = 10 children of 10 frontier nodes per row
        for vocab in shapes.vocabs:
            logp = torch.randn(batch * 10, vocab, generator=gd, device=device)
            out.append(Case("topk_rows", batch, vocab, lambda x=logp: K.topk_rows(x, 10), logp.numel() * 4,
                            f"[{batch * 10}, {vocab}] fp32, k=10"))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------------------------


def median_ms(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> float:
    """Median wall time of ``fn`` in milliseconds: CUDA events on a GPU, ``perf_counter`` on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _flat(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if result is None:
        return []
    return [t for item in result for t in _flat(item)]


def same(a, b, atol: float = 0.0) -> bool:
    """Equal outputs (tensors compared exactly, or within ``atol``; lists and tuples element by element)."""
    fa, fb = _flat(a), _flat(b)

    def close(x, y):
        if not atol:
            return torch.equal(x.cpu(), y.cpu())
        return bool(((x.float() - y.float()).abs() <= atol).all())
    return len(fa) == len(fb) and all(x.shape == y.shape and close(x, y) for x, y in zip(fa, fb))


def run(shapes: Shapes, device: torch.device, reps: int, warmup: int, peak_tbps: float, progress: bool = True,
        only: list[str] | None = None):
    """Time every case (``only``: the cases whose op name starts with one of these) with the reference and (where
    it can run) the kernel; returns one dict per case."""
    from tqdm.auto import tqdm

    kernels_run = K.triton_available() and (device.type == "cuda" or K.interpreter_enabled())
    rows = []
    chosen = [c for c in cases(shapes, device) if not only or any(c.op.startswith(o) for o in only)]
    for case in tqdm(chosen, desc="bench", disable=not progress):
        with K.kernel_mode("torch"):
            ref_ms = median_ms(case.run, device, reps, warmup)
            ref_out = None if case.op == "compact_kv_inplace" else case.run()  # in place: not idempotent
        kernel_ms = identical = None
        if kernels_run:
            with K.kernel_mode("triton"):
                kernel_ms = median_ms(case.run, device, reps, warmup)
                identical = True if ref_out is None else same(case.run(), ref_out, case.atol)
        seconds = None if kernel_ms is None else kernel_ms / 1e3
        achieved = None if seconds is None else case.bytes / seconds / 1e12
        rows.append({
            "op": case.op, "batch": case.batch, "vocab": case.vocab, "shape": case.note, "bytes": case.bytes,
            "ref_ms": ref_ms, "kernel_ms": kernel_ms, "speedup": None if kernel_ms is None else ref_ms / kernel_ms,
            "kernel_tbps": achieved, "fraction_of_peak": None if achieved is None else achieved / peak_tbps,
            "identical": identical,
        })
    return rows


def table(rows: list[dict], peak_tbps: float) -> str:
    """Markdown table of the results."""
    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    lines = [f"| op | B | V | ref ms | kernel ms | speedup | kernel TB/s | of {peak_tbps} TB/s | same | shape |",
             "|---|---:|---:|---:|---:|---:|---:|---:|:-:|---|"]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['batch']} | {r['vocab'] or '-'} | {fmt(r['ref_ms'], '.3f')} "
            f"| {fmt(r['kernel_ms'], '.3f')}"
            f" | {fmt(r['speedup'], '.1f')} | {fmt(r['kernel_tbps'], '.3f')} | {fmt(r['fraction_of_peak'], '.1%')}"
            f" | {'-' if r['identical'] is None else 'yes' if r['identical'] else 'NO'} | {r['shape']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Compile check (no GPU needed)
# ----------------------------------------------------------------------------------------------------------------


def compile_only(arch: int) -> list[dict]:
    """Compile every kernel, at the quick shapes' launch arguments, for ``sm_<arch>`` (no GPU needed).

    The launchers run on CPU tensors with each kernel replaced by a recorder; each recorded launch is then compiled
    through ``triton.compile`` down to a cubin.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if K.interpreter_enabled():
        raise SystemExit("--compile-only needs compiled kernels: unset TRITON_INTERPRET")
    types = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
             torch.int64: "i64", torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
    modules = [K.tree_mask.__module__, K.verify_greedy.__module__, K.compact_kv.__module__,
               K.parallel_draft_inputs.__module__, K.emitted_tokens.__module__]
    launches = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.fn, args, kwargs))

    patched = []
    for name in modules:
        module = sys.modules[name]
        patched.append((module, "use_kernel", module.use_kernel))
        module.use_kernel = lambda *a: True
        for attr, value in list(vars(module).items()):
            if attr.endswith("_kernel") and isinstance(value, triton.runtime.jit.JITFunction):
                patched.append((module, attr, value))
                setattr(module, attr, Recorder(value))
    try:
        # the launch arguments of the full run, at a batch and vocabulary the CPU holds easily
        for case in cases(FULL._replace(batches=(3,), vocabs=(8193,), prefix=100, layers=2), torch.device("cpu")):
            case.run()
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)
    results, seen = [], set()
    for fn, args, kwargs in launches:
        signature, constexprs = {}, {}
        for name, value in zip(fn.arg_names, args):
            if isinstance(value, torch.Tensor):
                signature[name] = "*" + types[value.dtype]
            else:
                signature[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
        for name, value in kwargs.items():
            signature[name], constexprs[name] = "constexpr", value
        key = (fn.__name__, tuple(sorted(signature.items())), tuple(sorted(constexprs.items())))
        if key in seen:
            continue
        seen.add(key)
        t0 = time.perf_counter()
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", arch, 32))
        results.append({"kernel": fn.__name__, "constexprs": constexprs, "cubin_bytes": len(compiled.asm["cubin"]),
                        "shared_bytes": compiled.metadata.shared, "seconds": time.perf_counter() - t0})
        print(f"{fn.__name__:32s} sm_{arch} ok  cubin {len(compiled.asm['cubin']):7d} B  {constexprs}")
    return results


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_kernels", help="folder for bench_kernels.json / .md")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per case (default 50, quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 5, quick 1)")
    ap.add_argument("--peak-tbps", type=float, default=PEAK_TBPS, help="bandwidth to compare with (TB/s)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--only", nargs="+", default=None, help="only the ops whose name starts with one of these")
    ap.add_argument("--compile-only", type=int, default=None, metavar="ARCH",
                    help="compile every kernel for sm_ARCH (e.g. 90) and exit; needs no GPU")
    args = ap.parse_args(argv)
    if args.compile_only is not None:
        return compile_only(args.compile_only)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shapes = QUICK if args.quick else FULL
    reps = args.reps or (3 if args.quick else 50)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    previous = _dispatch.get_kernel_mode()
    try:
        rows = run(shapes, device, reps, warmup, args.peak_tbps, progress=not args.quick, only=args.only)
    finally:
        _dispatch.set_kernel_mode(previous)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    md = table(rows, args.peak_tbps)
    print(f"device: {name}; kernels {'interpreted' if device.type == 'cpu' and K.interpreter_enabled() else ''}")
    print(md)
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__, "peak_tbps": args.peak_tbps, "reps": reps, "warmup": warmup,
            "quick": args.quick, "interpreted": device.type == "cpu" and K.interpreter_enabled()}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    with open(os.path.join(args.out, "bench_kernels.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "bench_kernels.md"), "w") as f:
        f.write(f"# specdec.kernels benchmark\n\n{json.dumps(meta)}\n\n{md}\n")
    return rows


if __name__ == "__main__":
    main()
