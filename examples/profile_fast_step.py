"""Count the aten ops of one ``generate(fast=True)`` decoding step, inside vs outside the captured forwards.

A CPU proxy for the fast path's per-step host work (issue 13): on an H200 host every eager op outside a CUDA graph
costs ~5-15 us of CPU time while the GPU idles, whereas a graph replay costs one launch whatever it holds. On CPU
the captured functions run eagerly (:func:`specdec.graphs.capture_graph_ref`), so a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every op; a flag flipped around each captured
function splits them into regions:

- ``target graph``: inside the target's captured bucket forward (one replay on CUDA);
- ``drafter graphs``: inside the drafter's captured draft / absorb steps (one replay each on CUDA);
- ``kernels``: launches of the Triton kernels the fast path calls outside the graphs (``tree_mask``,
  ``compact_kv``, ``verify_greedy``, ``emitted_tokens``, ``accepted_feedback``): counted as one op each,
  since on CUDA each is one launch (on CPU their torch references run); inside a captured function they are part
  of its replay and count to its region;
- ``outside``: every other aten op, the eager work around the graphs (what this issue cuts).

Per step = (ops of a long call - ops of a short call) / (steps of the long call - steps of the short call), so the
prefill and the one-off captures cancel out. The model is a tiny float32 Llama built from a config (nothing is
downloaded); the EAGLE-2 drafter is an untrained head (acceptance does not matter: every step runs the tree path).

Example::

    python examples/profile_fast_step.py                 # table: plain and EAGLE-2, batch 1 and 4
    python examples/profile_fast_step.py --ops           # also the outside ops by name
    python examples/profile_fast_step.py --host          # also the host ms per step, the device work stubbed

``--host`` times the host's share of a step: the captured functions return the outputs saved at their capture and
each kernel its first result per shapes, so what is left is the step's Python and the tensor ops outside the graphs
(tiny tensors here): a CPU proxy of what a GPU host must do per step before the device can run it.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import time
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec
import specdec.kernels
import specdec.kernels.verify
import specdec.static
import specdec.step
from specdec.graphs import CapturedStep, GraphedDrafter, _hold, _map, _spec, capture_graph_ref

REGIONS = ("target graph", "drafter graphs", "kernels", "outside")


class OpCounter(TorchDispatchMode):
    """Counts aten ops per region; :meth:`within` marks a region (the innermost one counts an op).

    Attributes:
        ops: per region, a ``Counter`` of op names.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops = {region: collections.Counter() for region in REGIONS + ("ignored",)}
        self._stack = ["outside"]

    @contextlib.contextmanager
    def within(self, region: str) -> Iterator[None]:
        """Count the ops run inside the block to ``region``."""
        self._stack.append(region)
        try:
            yield
        finally:
            self._stack.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        region = self._stack[-1]
        if region != "kernels":  # a kernel counts once, at its call
            self.ops[region][str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    def totals(self) -> dict[str, int]:
        """Ops per region."""
        return {region: sum(self.ops[region].values()) for region in REGIONS}


def _in_region(counter: OpCounter, region: str, fn: Callable) -> Callable:
    def run(*args, **kwargs):
        with counter.within(region):
            return fn(*args, **kwargs)
    return run


def _kernel(counter: OpCounter, name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)  # keeps the attributes callers read (a verifier's ``takes_logits``)
    def run(*args, **kwargs):
        if counter._stack[-1] in ("target graph", "drafter graphs"):  # part of a replay on CUDA, not a launch
            return fn(*args, **kwargs)
        counter.ops["kernels"][name] += 1
        with counter.within("kernels"):
            return fn(*args, **kwargs)
    return run


def _flagged_capture(counter: OpCounter, region: str) -> Callable:
    """``capture_graph_ref`` whose captured function counts to ``region`` (the capture itself is ignored)."""
    def capture(fn, inputs):
        with counter.within("ignored"):
            captured = capture_graph_ref(fn, inputs, warmup=0)
        captured._run = _in_region(counter, region, captured._run)  # its output copies are a replay's work too
        return captured
    return capture


@contextlib.contextmanager
def counting(counter: OpCounter) -> Iterator[OpCounter]:
    """Within the block, the fast path's captures and kernels report to ``counter`` (the module names are swapped
    back on exit)."""
    swaps = [(specdec.static, "capture_graph_ref", lambda fn, inputs, warmup=0:
              _flagged_capture(counter, "target graph")(fn, inputs)),
             (specdec.static, "tree_mask", _kernel(counter, "tree_mask", specdec.static.tree_mask)),
             (specdec.kernels.KVCompactPlan, "__call__",  # the static cache's compact_kv
              _kernel(counter, "compact_kv", specdec.kernels.KVCompactPlan.__call__)),
             (specdec.kernels, "verify_greedy", _kernel(counter, "verify_greedy", specdec.kernels.verify_greedy)),
             (specdec.kernels, "emitted_tokens", _kernel(counter, "emitted_tokens", specdec.kernels.emitted_tokens)),
             (specdec.step, "accepted_feedback", _kernel(counter, "accepted_feedback",
                                                         specdec.step.accepted_feedback))]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, new in swaps:
        setattr(module, name, new)
    try:
        with counter:
            yield counter
    finally:
        for module, name, old in saved:
            setattr(module, name, old)


def tiny_llama(seed: int = 0, vocab: int = 97) -> torch.nn.Module:
    """A 2-layer float32 Llama with random weights, built from a config."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                         dtype=torch.float32).eval()


def _bare_drafter(model: torch.nn.Module, method: str):
    """The drafter of ``method`` (untrained heads), not yet graphed: EAGLE-2 (10 nodes, depth 3, top-3), P-EAGLE (2
    layers, 4 levels), DFlash (2 layers, block 5: 4 levels), Medusa (4 heads, the chain of top-1s), prompt lookup
    (fixed-width chains of 4)."""
    from specdec import recipes
    from specdec.heads import DFlashHead, Eagle1Head, MedusaHead, PEagleHead

    torch.manual_seed(1)
    if method == "eagle2":
        return recipes.eagle2(Eagle1Head.from_target(model), total_tokens=10, depth=3, top_k=3, cuda_graphs=False)
    if method == "peagle":
        return recipes.peagle(PEagleHead.from_target(model, num_layers=2, max_drafts=4), cuda_graphs=False)
    if method == "dflash":
        return recipes.dflash(DFlashHead.from_target(model, block_size=5, num_layers=2), cuda_graphs=False)
    if method == "medusa":
        return recipes.medusa(MedusaHead.from_target(model, num_heads=4), tree="chain", cuda_graphs=False)
    if method == "lookup":
        return recipes.prompt_lookup(4, fixed_width=True)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


#: What the profile covers: plain steps, then each drafter's steps.
METHODS = ("plain", "eagle2", "peagle", "dflash", "medusa", "lookup")


def graphed_drafter(model: torch.nn.Module, method: str, counter: OpCounter | None) -> GraphedDrafter | None:
    """``method``'s drafter (``None`` for plain steps) graphed on CPU through ``counter``."""
    if method == "plain":
        return None
    capture = capture_graph_ref if counter is None else _flagged_capture(counter, "drafter graphs")
    return GraphedDrafter(_bare_drafter(model, method), capture=capture, device_types=("cpu",))



def count_call(model, ids: torch.Tensor, max_new_tokens: int, method: str) -> tuple[OpCounter, int]:
    """Ops of one ``generate(fast=True)`` call and its number of decoding steps.

    Args:
        model: the target.
        ids: Shape ``[B, T]``, prompts (no padding).
        max_new_tokens: new tokens per row.
        method: one of :data:`METHODS`.

    Returns:
        ``(counter, steps)``.
    """
    counter = OpCounter()
    drafter = graphed_drafter(model, method, counter)
    with counting(counter):
        out = specdec.generate(model, ids, drafter=drafter, max_new_tokens=max_new_tokens, eos_token_id=[],
                               fast=True)
    return counter, out.stats.num_steps


def per_step(model, ids: torch.Tensor, method: str, short: int = 6, long: int = 30) -> dict[str, float]:
    """Ops per decoding step and region (difference of a ``long`` and a ``short`` call)."""
    (c1, s1), (c2, s2) = count_call(model, ids, short, method), count_call(model, ids, long, method)
    t1, t2 = c1.totals(), c2.totals()
    result = {region: (t2[region] - t1[region]) / (s2 - s1) for region in REGIONS}
    result["outside ops"] = {name: (c2.ops["outside"][name] - c1.ops["outside"][name]) / (s2 - s1)
                             for name in c2.ops["outside"]}
    result["kernel launches"] = {name: (c2.ops["kernels"][name] - c1.ops["kernels"][name]) / (s2 - s1)
                                 for name in c2.ops["kernels"]}
    return result


def _saved_outputs_capture(fn: Callable, inputs: tuple, warmup: int = 0) -> CapturedStep:
    """A capture whose replays return the outputs of the one run at capture (no tensor work): what is left of a
    replay on the host is its input copies and output clones, as with a CUDA graph."""
    static = _map(torch.Tensor.clone, inputs)
    out = fn(*static)
    _hold(out)  # a captured step's outputs, as capture_graph registers them (a drafter may read them in place)
    return CapturedStep(static, lambda: out)


def _saved_outputs(fn: Callable) -> Callable:
    """``fn`` (a kernel) run once per input shapes; later calls return that first result (or fill nothing into
    ``out=``, already written once): on CUDA a kernel is one launch, whatever its work."""
    results: dict = {}

    @functools.wraps(fn)
    def run(*args, **kwargs):
        key = (_spec(tuple(a for a in args if isinstance(a, torch.Tensor))),
               tuple(sorted((k, repr(v)) for k, v in kwargs.items() if not isinstance(v, torch.Tensor))))
        if key not in results:
            results[key] = fn(*args, **kwargs)
        return kwargs["out"] if kwargs.get("out") is not None else results[key]
    return run


@contextlib.contextmanager
def device_work_stubbed() -> Iterator[None]:
    """Within the block the fast path's captured functions and kernels return saved outputs, so a CPU run times
    the host work of a step: its Python and the tensor ops outside the graphs (tiny here)."""
    swaps = [(specdec.static, "capture_graph_ref", _saved_outputs_capture),
             (specdec.static, "tree_mask", _saved_outputs(specdec.static.tree_mask)),
             (specdec.step, "emitted_tokens", _saved_outputs(specdec.step.emitted_tokens)),
             (specdec.step, "accepted_feedback", _saved_outputs(specdec.step.accepted_feedback)),
             (specdec.kernels.KVCompactPlan, "__call__", _saved_outputs(specdec.kernels.KVCompactPlan.__call__)),
             (specdec.kernels.verify, "verify_greedy_ref", _saved_outputs(specdec.kernels.verify.verify_greedy_ref))]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, new in swaps:
        setattr(module, name, new)
    try:
        yield
    finally:
        for module, name, old in saved:
            setattr(module, name, old)


def host_ms_per_step(model, ids: torch.Tensor, method: str, short: int = 40, long: int = 300,
                     repeats: int = 3) -> float:
    """Host milliseconds per decoding step of ``generate(fast=True)`` with the device work stubbed (best of
    ``repeats`` differences of a ``long`` and a ``short`` call). With saved outputs every draft is rejected, so
    each step is a tree step of the same shape."""
    drafter = None
    if method != "plain":
        drafter = GraphedDrafter(_bare_drafter(model, method), capture=_saved_outputs_capture, device_types=("cpu",))
    best = float("inf")
    with device_work_stubbed():
        def run(n: int):
            return specdec.generate(model, ids, drafter=drafter, max_new_tokens=n, eos_token_id=[], fast=True)
        run(short)
        for _ in range(repeats):
            t0 = time.perf_counter()
            a = run(short)
            t1 = time.perf_counter()
            b = run(long)
            t2 = time.perf_counter()
            best = min(best, 1e3 * ((t2 - t1) - (t1 - t0)) / (b.stats.num_steps - a.stats.num_steps))
    return best


def main() -> None:
    """Print the table (and, with ``--ops``, the outside ops by name)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--methods", nargs="+", default=["plain", "eagle2"], choices=METHODS)
    parser.add_argument("--ops", action="store_true", help="list the outside ops per step by name")
    parser.add_argument("--host", action="store_true",
                        help="also time the host work per step, with the captured functions and kernels stubbed")
    args = parser.parse_args()
    model = tiny_llama()
    rows = []
    for method in args.methods:
        for batch in args.batch:
            ids = torch.randint(1, 97, (batch, 12), generator=torch.Generator().manual_seed(batch))
            rows.append((method, batch, per_step(model, ids, method)))
    print(f"{'method':<8} {'B':>3} " + " ".join(f"{r:>15}" for r in REGIONS) + "   (aten ops per step)")
    for method, batch, result in rows:
        print(f"{method:<8} {batch:>3} " + " ".join(f"{result[r]:>15.1f}" for r in REGIONS))
    if args.host:
        torch.set_num_threads(1)
        print("\nhost ms per step (device work stubbed; CPU proxy of the GPU host's work):")
        for method in args.methods:
            for batch in args.batch:
                ids = torch.randint(1, 97, (batch, 12), generator=torch.Generator().manual_seed(batch))
                print(f"  {method:<8} B={batch}: {host_ms_per_step(model, ids, method):.3f}")
    if args.ops:
        for method, batch, result in rows:
            named = sorted(((n, c) for n, c in result["outside ops"].items() if c), key=lambda x: -x[1])
            print(f"\n{method} B={batch} outside: " + ", ".join(f"{n.removeprefix('aten.')} {c:g}" for n, c in named))
            launches = sorted(((n, c) for n, c in result["kernel launches"].items() if c), key=lambda x: -x[1])
            print(f"{method} B={batch} kernel launches: " + (", ".join(f"{n} {c:g}" for n, c in launches) or "none"))


if __name__ == "__main__":
    main()
