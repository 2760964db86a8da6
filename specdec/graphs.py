"""CUDA graphs as a wrapper the caller applies: capture a step once per shape, replay it after copying inputs in.

A drafter's per-step work is ~100 small kernels per tree level; on an overhead-bound GPU their launches, not
their arithmetic, cost the time. Capturing the work as a CUDA graph and replaying it removes that cost. Nothing in
a drafter captures anything: the caller wraps it, as gpt-fast's caller applies ``torch.compile``::

    drafter = graphs.cuda_graphed(EagleDrafter(head, DynamicTree()))   # what recipes.eagle2(head) returns
    out = specdec.generate(target, ids, drafter=drafter)

**The capture utility** is generic (a drafter's step, later the target's verify step): :func:`capture_graph`
captures ``fn(*inputs)`` on static copies of ``inputs``; calling the result copies new inputs into those copies,
replays, and returns clones of the outputs. :func:`capture_graph_ref` has the same signature and semantics but
re-runs ``fn`` eagerly (any device): the reference the graph is tested against.

**The protocol a drafter implements to be graphed** (:class:`GraphableDrafter`), on top of
:class:`~specdec.drafters.Drafter`:

- ``draft_step(state, request) -> Step`` and ``absorb_step(state, feedback) -> Step``: the tensor work of
  ``propose`` / ``update`` as a :class:`Step`. Its ``fn(*inputs)`` must have no host sync and static shapes given
  ``key`` and the shapes of ``inputs``; it may read and write, in place, only the tensors in ``buffers`` besides
  its inputs (the drafter's cache), and running it twice on the same inputs must give the same result (capture
  warms it up on the real inputs). ``finish(outputs)`` does the host bookkeeping and returns what the method
  returns. ``key=None`` means "run eagerly" (e.g. a sampled tree at T > 0: its random draws are not captured).
  Then ``propose(state, request)`` is exactly ``run_step(draft_step(state, request))``, ``update`` likewise.
- ``start(feedback, *, static=False, buffers=None)``: with ``static=True`` the drafter allocates buffers meant to
  stay put (with headroom), reusing ``buffers`` (the ``Step.buffers`` of an earlier run) when they fit, so
  graphs captured in one ``generate()`` call replay in the next.
- optionally ``for_fast_path() -> drafter``: the drafter ``generate(fast=True)`` graphs in this one's place, giving
  the same tokens in a form that captures (a prompt lookup's fixed-width copy; :func:`specdec.static.fast_drafter`).

:class:`GraphedDrafter` keeps one graph per (``key``, input shapes) while the buffers stay the same tensors; when a
step brings new buffers (the cache grew, the batch size changed) it drops its graphs and captures again. Where a
step cannot be captured (a CPU device, ``key=None``) it runs the drafter eagerly, so on CPU a graphed drafter *is*
the eager drafter. A graphed drafter serves one ``generate()`` at a time (its states are consumed in order anyway).
Graphs are for inference: the wrapper runs under ``torch.no_grad()``.

**The next draft inside the update** (``prefetch=True``; off by default: on the H200 it saved 0-0.15 ms of a ~1-1.4
ms parallel-drafter step, within the spread between runs; ``docs/fast_path_log.md``, session 22). A drafter whose
``prefetches_drafts`` is true promises that its ``draft_step`` reads of a request only ``num_drafts`` and ``roots``
(the parallel drafters with stateful heads: P-EAGLE, DFlash, DSpark), so the next step's draft can be computed as
soon as the update's feedback (whose ``roots`` are the next request's) is in. Their ``update`` then replays *one*
graph holding the absorb step and the draft step for the ``K`` of the last request (the draft step's inputs taken
straight from the absorb step's outputs, not copied in), and the next ``propose`` returns that draft without
launching anything when it is called with the state ``update`` returned, those roots and that ``K``; otherwise
(another ``K``, a plain step) the prefetched draft is dropped and ``propose`` runs as usual, so the results never
change: the same kernels run on the same values in the same order. This saves a graph launch, the draft step's input
copies and its output clones per step (the parallel drafters' steps are bound by the host: ``docs/fast_path_log.md``,
sessions 19 and 22).

**The update and the next draft inside the caller's step** (``fold=True``, the default). For the same drafters,
prompt lookup with ``fixed_width=True`` (and EAGLE-1/2/3 built with ``EagleDrafter(fold=True)``, opt-in), the fast
path's greedy verify step (:meth:`specdec.static.StaticAdapter.forward_commit`) asks :meth:`GraphedDrafter.fold_for`
for the update it is about to need: the absorb step, built before the verify from the last feedback of that ``K``
(its shapes; the capacity grows first where it must), and the draft step chained after it as above. The verify's
capture then runs forward, verification, the feedback rows, the absorb step on those rows (never copied out) and the
next draft: **one graph replay a step instead of three**, the drafter's state tensors copied in as inputs. The next
``propose`` returns that draft as it returns a prefetched one. The first step at a ``K`` runs an ordinary update,
which shows where the draft step's inputs come from; a drafter whose update reads a tensor made from the feedback
(not the feedback's own tensors) is never folded. Same kernels, same values, same order: float32 greedy identity is
tested against ``fold=False`` and the eager drafter (``tests/test_parallel_graphs.py``); on the H200 the fixture's
parallel steps took 6-8% less time (``docs/fast_path_log.md``, session 30).

**Inputs read where they lie** (``in_place=True``, the default). A step's input that lies in the outputs of another
captured step alive (the fast path's verify step: the feedback rows an EAGLE or Medusa update absorbs are its own
output tensors, the same memory at every replay) is read by the graph where it lies instead of being copied into a
static input first: once a key's copying graph has run and shown that the step writes none of its inputs (their
version counters), a variant is captured that reads those tensors in place and copies only the others; it replays
whenever the same tensors come again. A replay reads them at the same point of the stream as the copy it replaces
(after everything queued before, before anything queued after), so the results are the copying graph's; a variant
keeps a reference to what it reads, so an address it matches is that tensor's. Tensors in the drafter's buffers
are always copied. 5 copies fewer per EAGLE-1/2 update (7 for EAGLE-3's three feature layers), 2 per Medusa update.
A step built with ``owned_outputs=True`` (EAGLE's update: its outputs live only in the state the next update
consumes) gets its graph's own output tensors, not clones; the next draft then reads them where they lie too (2
clones and 2 copies fewer a step). A step never reads its own outputs in place: its graphs rewrite them inside.
:func:`capture_graph_ref` returns the same output tensors at every call, as a replay does, so the CPU tests see the
same addresses the GPU sees.

References:
    NVIDIA, "CUDA Graphs" (CUDA C++ Programming Guide); PyTorch ``torch.cuda.graphs``; gpt-fast (compilation
    applied by the caller).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import torch

from .bench import no_gc
from .nn.attention import fixed_shape_attention

if TYPE_CHECKING:  # drafters import this module (Step); nothing here needs them at run time
    from .drafters.base import Feedback, ProposeRequest
    from .types import Draft

__all__ = ["Step", "run_step", "capture_graph", "capture_graph_ref", "closure_tensors", "CapturedStep",
           "GraphableDrafter", "GraphedDrafter", "Fold", "cuda_graphed", "static_buffers", "BoundMark", "mark_bound",
           "settle_bound", "CAPTURE_BLAS_CHOICES", "use_capture_blas", "capture_blas", "copy_changed"]

# The BLAS library a captured step's GEMMs are picked from (torch.backends.cuda.preferred_blas_library, set for the
# warm-up and the capture only; a graph keeps the kernels it captured). Measured on the H200 (session 21, Llama-2-7B
# shapes, CUDA-graph replays, weights cold in L2): cuBLASLt's pick for 61-64 rows of down_proj 28.1 -> 25.1 us, one
# 61-row verify forward's linears 3.70 -> 3.59 ms, the same elsewhere at 1-64 rows; the batch-1 EAGLE-2 step (FR-Spec
# 8192) 6.43 -> 6.28 / 6.27 ms, +-2% at batch 4 and 16 (bench_fast_7b.py --blas, one process per library).
CAPTURE_BLAS_CHOICES = ("cublaslt", "cublas", "torch")
_CAPTURE_BLAS = {"library": "cublaslt"}


def use_capture_blas(library: str) -> None:
    """Pick the BLAS library later captures (:func:`capture_graph`) run their GEMMs from.

    Args:
        library: ``"cublaslt"`` (default, as measured on the H200), ``"cublas"``, or ``"torch"`` (the process's
            own preference, :func:`torch.backends.cuda.preferred_blas_library`, left as it is). Graphs captured
            before the change keep theirs. :func:`specdec.fused.decode_kernels` sets it for a block.

    Raises:
        ValueError: ``library`` is none of :data:`CAPTURE_BLAS_CHOICES`.
    """
    if library not in CAPTURE_BLAS_CHOICES:
        raise ValueError(f"capture BLAS library must be one of {CAPTURE_BLAS_CHOICES}, got {library!r}")
    _CAPTURE_BLAS["library"] = library


def capture_blas() -> str:
    """The BLAS library :func:`capture_graph` captures under now (see :func:`use_capture_blas`)."""
    return _CAPTURE_BLAS["library"]


@contextlib.contextmanager
def _preferred_blas(device: torch.device):
    """Within the block, torch prefers :func:`capture_blas`'s library on a CUDA build; restored after."""
    library = _CAPTURE_BLAS["library"]
    if library == "torch" or device.type != "cuda" or torch.version.cuda is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


class Step(NamedTuple):
    """A unit of tensor work split the way a graph wrapper needs it.

    Attributes:
        fn: ``fn(*inputs) -> outputs`` (tensors, or tuples / NamedTuples of them): no host sync, static shapes
            given ``key`` and the input shapes.
        inputs: what varies from call to call (tensors or nested tuples of tensors); copied in before a replay.
        finish: ``finish(outputs)``: host-side bookkeeping; returns what the calling method returns.
        key: what, beyond the input shapes, fixes ``fn``'s work (e.g. ``("propose", depth)``); ``None``: never
            capture this step.
        buffers: the tensors ``fn`` reads or writes in place besides its inputs (nested tuples of tensors).
        owned_outputs: a graph wrapper may hand ``finish`` the captured step's own output tensors instead of clones:
            the next replay overwrites them, which is safe when ``finish`` keeps them only in what it returns and
            that is consumed before the step runs again (a drafter's state, consumed in order: EAGLE's update).
            Their memory then stays put, so the next step may read them where they lie (:class:`GraphedDrafter`'s
            ``in_place``) instead of copying them in.
    """

    fn: Callable[..., Any]
    inputs: tuple
    finish: Callable[[Any], Any]
    key: Hashable | None = None
    buffers: Any = ()
    owned_outputs: bool = False


def static_buffers(buffers, batch: int, need: int, device, allocate: Callable[[int], Any], *, slack: int = 256,
                   multiple: int = 256):
    """A cache for a graphed drafter's ``start(static=True, buffers=...)``: the earlier run's when it fits, else new.

    Graphs captured on a cache replay only while that cache stays the same tensors, so a static run reuses the
    previous run's cache (``Step.buffers``) when it has the batch size, the device and at least ``need`` slots, and
    otherwise allocates one with headroom (fewer reallocations, hence fewer recaptures).

    Args:
        buffers: the earlier run's cache, or ``None``: anything with ``keys`` (``[L, B, ...]``, batch on dim 1) and
            ``capacity``.
        batch: ``B``.
        need: the slots the run needs now.
        device: where the cache must live.
        allocate: ``allocate(capacity) -> cache``.
        slack: headroom added to ``need`` for a new cache.
        multiple: a new capacity is rounded up to this.

    Returns:
        ``buffers`` itself, or ``allocate(round_up(need + slack, multiple))``.
    """
    if (buffers is not None and buffers.keys.shape[1] == batch and buffers.capacity >= need
            and buffers.keys.device == torch.device(device)):
        return buffers
    return allocate((need + slack + multiple - 1) // multiple * multiple)


class BoundMark(NamedTuple):
    """A host-side upper bound's re-tightening under way (:func:`mark_bound`).

    Attributes:
        event: recorded after the copy (``None`` off CUDA: the copy is done).
        host: the values copied to the host.
        bound: the bound when the copy was queued.
    """

    event: Any
    host: torch.Tensor
    bound: int


def mark_bound(values: torch.Tensor, bound: int) -> BoundMark:
    """Start re-tightening ``bound`` (a host-side upper bound of ``values.max()``) without a host sync.

    Drafters keep such a bound of their rows' lengths to decide, on the host, when a cache must grow; it only grows
    between steps. Instead of reading ``int(values.max())`` (a sync), queue a non-blocking copy of ``values`` to
    the host and read it later with :func:`settle_bound`.

    Args:
        values: Shape ``[B]`` int64, on any device.
        bound: the current bound.

    Returns:
        A :class:`BoundMark`.
    """
    if not values.is_cuda:
        return BoundMark(None, values.clone(), bound)
    event = torch.cuda.Event()
    host = values.to("cpu", non_blocking=True)
    event.record()
    return BoundMark(event, host, bound)


def settle_bound(bound: int, mark: BoundMark | None, *, wait: bool = False) -> tuple[int, BoundMark | None]:
    """``bound`` lowered from ``mark`` once its copy has arrived (or, with ``wait``, after waiting for it).

    Math: ``min(bound, max(host) + bound - mark.bound)``: the largest value then, plus what the bound has grown by
    since, still an upper bound.

    Args:
        bound: the current bound.
        mark: from :func:`mark_bound`, or ``None``.
        wait: wait for the copy (e.g. before growing a cache, which would mean new graphs).

    Returns:
        ``(bound, mark)``: the mark is ``None`` once used.
    """
    if mark is None:
        return bound, None
    if mark.event is not None and not mark.event.query():
        if not wait:
            return bound, mark
        mark.event.synchronize()
    return min(bound, int(mark.host.max()) + bound - mark.bound), None


def run_step(step: Step) -> Any:
    """Run a step eagerly: ``step.finish(step.fn(*step.inputs))``.

    Args:
        step: a :class:`Step`.

    Returns:
        What ``step.finish`` returns.
    """
    return step.finish(step.fn(*step.inputs))


def _leaves(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return []


def _map(fn: Callable[[torch.Tensor], torch.Tensor], tree):
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple: rebuild by field
        return type(tree)(*(_map(fn, item) for item in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map(fn, item) for item in tree)
    return tree


def _spec(tree) -> tuple:
    """Shapes, dtypes and devices of a tree's tensors (and where the tree holds ``None``)."""
    if isinstance(tree, torch.Tensor):
        return (tuple(tree.shape), tree.dtype, tree.device)
    if isinstance(tree, (tuple, list)):
        return tuple(_spec(item) for item in tree)
    return (type(tree).__name__,)


class CapturedStep:
    """A function bound to static copies of its inputs; calling it copies new inputs in and returns fresh outputs.

    Built by :func:`capture_graph` (replays a CUDA graph) or :func:`capture_graph_ref` (re-runs the function).

    Attributes:
        inputs: the static input buffers (the same structure as the inputs given at capture).
        outputs: the captured outputs of the last run, the same tensors at every replay (``None`` before the first
            :meth:`run_matching`); what :class:`GraphedDrafter` keeps a step from reading in place.
    """

    def __init__(self, inputs: tuple, run: Callable[[], Any]):
        self.inputs = inputs
        self._run = run
        self._spec = _spec(inputs)
        self._leaves = _leaves(inputs)
        self.outputs: Any = None

    def __call__(self, *inputs) -> Any:
        """Copy ``inputs`` into the static buffers, run, and return clones of the outputs.

        Args:
            *inputs: the same structure, shapes and dtypes as at capture.

        Returns:
            The outputs (tensors cloned: the next call overwrites the captured ones).
        """
        if _spec(inputs) != self._spec:
            raise ValueError(f"inputs {_spec(inputs)} differ from the captured {self._spec}: capture another "
                             f"step for these shapes")
        return self.run_matching(inputs)

    def run_matching(self, inputs: tuple, *, clone: bool = True) -> Any:
        """:meth:`__call__` for a caller that has already matched ``inputs`` to the captured spec (its lookup key
        holds it, as :class:`GraphedDrafter`'s does): no second walk over the inputs' shapes. ``clone=False``
        returns the captured outputs themselves (a :class:`Step` with ``owned_outputs``)."""
        for static, new in zip(self._leaves, _leaves(inputs)):
            static.copy_(new)
        self.outputs = self._run()
        return _map(torch.Tensor.clone, self.outputs) if clone else self.outputs


def copy_changed(statics, news, seen: dict) -> None:
    """``static.copy_(new)`` for each pair, except where ``new`` is the tensor copied there last time and neither
    was written since (their version counters): a caller passing the same constant at every call (the all-rows
    mask) launches nothing for it.

    Args:
        statics: a captured step's static input tensors.
        news: the tensors to copy in (the same count).
        seen: the caller's record of the last copies (position -> (tensor, versions)), updated here.
    """
    for i, (static, new) in enumerate(zip(statics, news)):
        last = seen.get(i)
        try:
            if last is not None and last[0] is new and last[1] == (new._version, static._version):
                continue
            static.copy_(new)
            seen[i] = (new, (new._version, static._version))
        except RuntimeError:  # inference tensors keep no version counter: always copy
            static.copy_(new)
            seen.pop(i, None)


def capture_graph(fn: Callable[..., Any], inputs: tuple, *, warmup: int = 2) -> CapturedStep:
    """Capture ``fn(*inputs)`` as a CUDA graph on static copies of ``inputs``.

    ``fn`` runs ``warmup`` times on a side stream first (lazy tables, kernels' first-call work, allocator),
    then once under capture; every call of the result replays the graph. Both run inside
    :func:`~specdec.nn.fixed_shape_attention` (masked attention may use cuDNN's SDPA: the shape is fixed) and
    with torch preferring :func:`capture_blas`'s BLAS library (cuBLASLt by default; restored after). The graph reads
    the tensors ``fn`` reaches besides its inputs (:func:`closure_tensors`) where they lay at the capture; the result
    keeps them alive as long as it lives (``fn`` itself is not kept).

    Args:
        fn: a function of tensors (see :class:`Step`); it runs ``warmup`` times for real.
        inputs: example inputs on one CUDA device (tensors, nested tuples of tensors).
        warmup: eager runs before the capture.

    Returns:
        A :class:`CapturedStep`.

    Raises:
        ValueError: no input tensor is on a CUDA device.

    References:
        PyTorch ``torch.cuda.graph`` (warm-up on a side stream before capture).
    """
    device = next((t.device for t in _leaves(inputs) if t.is_cuda), None)
    if device is None:
        raise ValueError("capture_graph needs inputs on a CUDA device; run the step eagerly (or use "
                         "capture_graph_ref) elsewhere")
    static = _map(torch.Tensor.clone, inputs)
    with torch.cuda.device(device), fixed_shape_attention(), _preferred_blas(device):  # one shape: one cuDNN plan
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Python's cyclic collector off during the capture: a collection that frees a dead CUDA graph (a drafter or
        # adapter dropped earlier, its graphs in a reference cycle) resets it under capture, which CUDA forbids and
        # which invalidates this capture (torch no longer collects before a capture; session 42's CUDA fuzz).
        with no_gc(), torch.cuda.graph(graph):
            outputs = fn(*static)

    _hold(outputs)
    # The graph reads every tensor fn closes over at the address it had during the capture; torch keeps none of
    # them alive, and fn itself goes when its caller drops it. Kept here: freed, their memory would go to other
    # tensors and the replays would read whatever those hold (session 37: a mask constant made before a capture).
    closed_over = closure_tensors(fn)

    def replay():
        graph.replay()
        return outputs

    replay.closed_over = closed_over
    return CapturedStep(static, replay)


def closure_tensors(fn: Callable[..., Any], max_depth: int = 8) -> tuple[torch.Tensor, ...]:
    """The tensors a function reaches without being called: through closures, default arguments,
    ``functools.partial``, bound methods, tuples (NamedTuples), lists, dicts and other objects' attributes (a
    drafter's tree plans, the fused decoder's tables), to ``max_depth`` levels; not inside modules (a module's
    parameters live as long as the module, and holding one could keep a model alive).

    A CUDA graph captured from ``fn`` reads these where they lay at its capture; :func:`capture_graph` keeps them
    alive as long as the graph, so that their memory is never handed to another tensor under a replay (the CPU
    reference keeps ``fn`` itself). Only tensors are held, never the objects around them.

    Args:
        fn: any callable.
        max_depth: how many containers deep to look.

    Returns:
        The tensors found, each once (by identity), in the order met.
    """
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()

    def walk(obj, depth: int) -> None:
        try:
            visit(obj, depth)
        except ReferenceError:  # a dead weakref.proxy: nothing behind it to keep
            pass

    def visit(obj, depth: int) -> None:
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), obj)
            return
        if depth > max_depth or id(obj) in seen or isinstance(obj, _NOT_WALKED):
            return
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            items = [_contents(c) for c in obj.__closure__ or ()]
            items += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            items += list(vars(obj).values())  # __wrapped__, a compiled function's original, ...
        elif isinstance(obj, functools.partial):
            items = [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, types.MethodType):
            items = [obj.__func__, obj.__self__]
        elif isinstance(obj, (tuple, list, set, frozenset)):
            items = list(obj)
        elif isinstance(obj, dict):
            items = list(obj.values())
        elif dataclasses.is_dataclass(obj):
            items = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
        elif hasattr(obj, "__dict__"):
            items = list(vars(obj).values())
        else:
            return
        for item in items:
            walk(item, depth + 1)

    walk(fn, 0)
    return tuple(found.values())


_NOT_WALKED = (torch.nn.Module, type, str, bytes, int, float, types.ModuleType, torch.dtype, torch.device)


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not bound yet
        return None


# The outputs of every captured step alive, by their storage's address: the same memory at every replay, which a
# graphed drafter's step may read where it lies (GraphedDrafter's in_place). Weak: an entry goes with its tensor.
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _hold(outputs) -> None:
    for t in _leaves(outputs):
        _HELD[t.untyped_storage().data_ptr()] = t


def _held(t: torch.Tensor, besides: frozenset = frozenset()) -> bool:
    """Whether ``t`` lies in the outputs of a captured step alive (memory that stays put between its replays), in
    none of the storages (addresses) ``besides``."""
    at = t.untyped_storage().data_ptr()
    return at in _HELD and at not in besides


def capture_graph_ref(fn: Callable[..., Any], inputs: tuple, *, warmup: int = 2) -> CapturedStep:
    """Reference for :func:`capture_graph` (same signature and call semantics), on any device, without a graph.

    Each call copies the inputs into the static copies and runs ``fn`` on them eagerly; as a graph replay does, it
    writes the outputs into the tensors its first call returned and returns those same tensors (a caller that
    keeps an output across calls sees it overwritten, as on CUDA).

    Args:
        fn: a function of tensors.
        inputs: example inputs (tensors, nested tuples of tensors).
        warmup: eager runs at "capture", as :func:`capture_graph` does.

    Returns:
        A :class:`CapturedStep`.
    """
    static = _map(torch.Tensor.clone, inputs)
    for _ in range(warmup):
        fn(*static)
    held = []  # the first run's outputs: the tensors every later run writes and returns, as a graph's replays do

    def run():
        outputs = fn(*static)
        if not held:
            held.append(outputs)
            _hold(outputs)
            return outputs
        for mine, new in zip(_leaves(held[0]), _leaves(outputs)):
            if mine is not new:
                mine.copy_(new)
        return held[0]

    return CapturedStep(static, run)


@runtime_checkable
class GraphableDrafter(Protocol):
    """A :class:`~specdec.drafters.Drafter` whose steps a :class:`GraphedDrafter` can capture (module docstring).

    Attributes:
        max_num_drafts, feature_layers: as :class:`~specdec.drafters.Drafter`.
    """

    max_num_drafts: int
    feature_layers: tuple[int, ...]

    def propose(self, state: Any, request: ProposeRequest) -> tuple[Draft, Any]:
        """``run_step(self.draft_step(state, request))``."""

    def update(self, state: Any, feedback: Feedback) -> Any:
        """``run_step(self.absorb_step(state, feedback))``."""

    def start(self, feedback: Feedback, *, static: bool = False, buffers: Any = None) -> Any:
        """Build the state; ``static=True``: on buffers that stay put, reusing ``buffers`` when they fit."""

    def draft_step(self, state: Any, request: ProposeRequest) -> Step:
        """``propose``'s work as a :class:`Step` whose ``finish`` returns ``(draft, state)``."""

    def absorb_step(self, state: Any, feedback: Feedback) -> Step:
        """``update``'s work as a :class:`Step` whose ``finish`` returns the new state."""


class GraphedDrafter:
    """A drafter whose steps run as CUDA graphs, captured once per shape and replayed (see the module docstring).

    Args:
        drafter: a :class:`GraphableDrafter`.
        capture: how to capture a step (:func:`capture_graph`; :func:`capture_graph_ref` for tests).
        device_types: device types to capture on; elsewhere the wrapped drafter runs eagerly.

    Attributes:
        drafter: the wrapped drafter.
        max_num_drafts, feature_layers, vocab_size: the wrapped drafter's.
        counts: running totals for diagnosis: ``captures`` (graphs captured), ``replays``, ``eager`` (steps run
            eagerly: no key, e.g. a prompt-wide update), ``buffer_changes`` (new buffers: every held graph was
            dropped), ``prefetched`` (drafts ``propose`` returned from the update's graph or from a fold; see the
            module), ``folded`` (updates run inside a caller's captured step, :meth:`fold_for`) and ``in_place``
            (replays that read some inputs where they lie). A benchmark reads them around a timed run to see
            whether it captured anything.
        prefetch: compute the next draft inside ``update`` for drafters that allow it (module docstring; default
            off).
        fold: let a caller run the update and the next draft inside its own captured step (:meth:`fold_for`;
            the fast path's greedy verify step does; default on). With ``prefetch`` on, the update's own graph
            drafts ahead instead and nothing is folded.
        in_place: read a step's inputs where they lie when they are the same tensors call after call (the fast
            path's verify outputs that an update absorbs), instead of copying them into the graph's inputs
            (module docstring; default on; never with a compiling ``capture``, which would compile each variant).
    """

    def __init__(self, drafter: GraphableDrafter, *, capture: Callable[..., CapturedStep] = capture_graph,
                 device_types: tuple[str, ...] = ("cuda",), prefetch: bool = False, fold: bool = True,
                 in_place: bool = True):
        if not isinstance(drafter, GraphableDrafter):
            raise TypeError(f"{type(drafter).__name__} cannot be graphed: it needs draft_step(), absorb_step() and "
                            f"start(..., static=, buffers=) (see specdec.graphs); use it unwrapped")
        self.drafter = drafter
        self.capture = capture
        self.device_types = tuple(device_types)
        self._graphs: dict = {}
        self._buffers: Any = None
        self._buffer_ids: tuple = ()
        self.counts = {"captures": 0, "replays": 0, "eager": 0, "buffer_changes": 0, "prefetched": 0, "folded": 0,
                       "in_place": 0}
        self.prefetch = bool(prefetch)
        self._request: Any = None  # the last propose's request: the template of the next one
        self._prefetched: tuple | None = None  # (state, roots, num_drafts, (draft, state)) from the last update
        self._unfused: set = set()  # update+draft keys found not fusable (see _update_and_draft)
        self.fold = bool(fold)
        self.in_place = bool(in_place)
        self._in_place: dict = {}  # graph key -> _InPlace (the variants reading stable inputs where they lie)
        self._buffer_storages: frozenset = frozenset()
        self._fold_plans: dict = {}  # (absorb key, its inputs' spec, K) -> _FoldPlan
        self._fold_feedback: dict = {}  # K -> the last feedback seen at that K (shapes for the absorb step)

    def __repr__(self) -> str:
        return f"cuda_graphed({self.drafter!r})"

    @property
    def max_num_drafts(self) -> int:
        """The wrapped drafter's largest ``K``."""
        return self.drafter.max_num_drafts

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target layers the wrapped drafter reads."""
        return self.drafter.feature_layers

    @property
    def vocab_size(self) -> int | None:
        """The wrapped drafter's vocabulary, if it states one."""
        return getattr(self.drafter, "vocab_size", None)

    @property
    def graph_keys(self) -> list:
        """The ``Step.key`` of every graph held now (one per key and input shapes)."""
        return [key for key, _ in self._graphs]

    @property
    def in_place_keys(self) -> list:
        """The ``Step.key`` of every graph held now that reads some inputs where they lie (one entry per such graph;
        see ``in_place``): each is a capture beside the copying graph of its key."""
        return [key for (key, _), tracker in self._in_place.items() for _ in tracker.variants]

    @property
    def buffers(self) -> Any:
        """The buffers the held graphs read and write (``Step.buffers`` of the last step run), or ``None``."""
        return self._buffers

    def _captures_on(self, device: torch.device) -> bool:
        return device.type in self.device_types

    def copies_feedback(self, device: torch.device) -> bool:
        """Whether :meth:`update` is done with a step's feedback when it returns on ``device``: its graph copied
        the tensors into its inputs, or read them where they lie in a replay queued before anything the caller
        queues next, so a caller may pass tensors that its next step overwrites (the fast path's captured step
        does)."""
        return self._captures_on(device)

    def _track(self, buffers: Any) -> None:
        ids = tuple((t.data_ptr(), tuple(t.shape), t.dtype) for t in _leaves(buffers))
        if ids != self._buffer_ids:  # new buffers: graphs captured on the old ones are stale
            self.counts["buffer_changes"] += bool(self._graphs)
            self._graphs, self._buffers, self._buffer_ids = {}, buffers, ids
            self._unfused, self._fold_plans, self._in_place = set(), {}, {}
            self._buffer_storages = frozenset(t.untyped_storage().data_ptr() for t in _leaves(buffers))

    def _run(self, step: Step) -> Any:
        self._track(step.buffers)
        if step.key is None:
            self.counts["eager"] += 1
            return run_step(step)
        key = (step.key, _spec(step.inputs))
        captured = self._graphs.get(key)
        clone = not step.owned_outputs
        if captured is None:
            captured = self._graphs[key] = self.capture(step.fn, step.inputs)
            self.counts["captures"] += 1
            outputs = captured.run_matching(step.inputs, clone=clone)  # the key holds the inputs' spec
            # consulted while in_place is on; never reading its own outputs in place (they are rewritten inside)
            self._in_place[key] = _InPlace(_reads_only(captured), _storages(getattr(captured, "outputs", None)))
            return step.finish(outputs)
        self.counts["replays"] += 1
        # not under compiling captures: each variant would be compiled anew (tens of seconds) for a few copies
        tracker = self._in_place.get(key) if self.in_place and not self._compiles() else None
        if tracker is not None:
            outputs = tracker.run(step, self._buffer_storages, self._capture_in_place, self.counts, clone)
            if outputs is not None:
                return step.finish(outputs)
        return step.finish(captured.run_matching(step.inputs, clone=clone))

    def _capture_in_place(self, step: Step, pinned: dict[int, torch.Tensor]) -> CapturedStep:
        """Capture ``step`` reading the leaves of ``pinned`` (input position -> tensor) where they lie; its inputs
        are the other leaves, in order."""
        shape, fn, n = step.inputs, step.fn, len(_leaves(step.inputs))

        def reading_in_place(*copied):
            rest = iter(copied)
            leaves = iter([pinned[i] if i in pinned else next(rest) for i in range(n)])
            return fn(*_map(lambda _: next(leaves), shape))

        self.counts["captures"] += 1
        return self.capture(reading_in_place, tuple(t for i, t in enumerate(_leaves(shape)) if i not in pinned))

    @torch.no_grad()
    def start(self, feedback: Feedback) -> Any:
        """Start the wrapped drafter, on its buffers of the previous run where they fit.

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback`.

        Returns:
            The wrapped drafter's state.
        """
        self._request = self._prefetched = None
        if self._fold_feedback and next(iter(self._fold_feedback.values())).tokens.shape[0] != feedback.tokens.shape[0]:
            self._fold_feedback = {}  # another batch size: the templates' shapes are stale (relearnt by the updates)
        if not self._captures_on(feedback.tokens.device):
            return self.drafter.start(feedback)
        return self.drafter.start(feedback, static=True, buffers=self._buffers)

    @torch.no_grad()
    def propose(self, state: Any, request: ProposeRequest) -> tuple[Draft, Any]:
        """The wrapped drafter's ``propose``, its tensor work replayed from a graph.

        Args:
            state: the wrapped drafter's state.
            request: the step's :class:`~specdec.drafters.ProposeRequest`.

        Returns:
            ``(draft, state)``.
        """
        if not self._captures_on(request.roots.device):
            return self.drafter.propose(state, request)
        prefetched, self._prefetched = self._prefetched, None
        if (prefetched is not None and prefetched[0] is state and prefetched[1] is request.roots
                and prefetched[2] == request.num_drafts):
            self.counts["prefetched"] += 1
            return prefetched[3]
        self._request = request
        return self._run(self.drafter.draft_step(state, request))

    @torch.no_grad()
    def update(self, state: Any, feedback: Feedback) -> Any:
        """The wrapped drafter's ``update``, its tensor work replayed from a graph.

        Args:
            state: the wrapped drafter's state.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            The new state.
        """
        self._prefetched = None
        if not self._captures_on(feedback.tokens.device):
            return self.drafter.update(state, feedback)
        absorb = self.drafter.absorb_step(state, feedback)
        if self._request is None or absorb.key is None:
            return self._run(absorb)
        if self.prefetch and getattr(self.drafter, "prefetches_drafts", False):
            return self._update_and_draft(absorb, feedback)
        if self._folds():
            return self._learn_fold(absorb, feedback)
        return self._run(absorb)

    def _next_request(self, roots: torch.Tensor, root_positions: torch.Tensor | None = None) -> ProposeRequest:
        """The next step's request as far as a drafter that drafts ahead reads it: the last propose's ``K``,
        ``roots`` and (for a fold) ``root_positions``."""
        return self._request._replace(roots=roots, root_positions=root_positions, active=None)

    def _discover(self, absorb: Step, inputs: tuple, request: ProposeRequest
                  ) -> tuple[Any, Step, list | None, str]:
        """Run ``absorb`` (its graph when held, else eagerly) and build the next draft step from its state.

        Returns ``(state, draft step, sources, how)``: ``sources`` (:func:`_sources`) says where each input of the
        draft step lies among the absorb step's outputs and ``inputs``, ``None`` where the two steps do not chain
        (the draft step has no key, other buffers, or an input from elsewhere); ``how`` is the count the absorb
        step's run falls under (``"replays"`` or ``"eager"``)."""
        captured = self._graphs.get((absorb.key, _spec(absorb.inputs)))
        outputs = captured.run_matching(absorb.inputs) if captured else absorb.fn(*absorb.inputs)
        state = absorb.finish(outputs)
        draft = self.drafter.draft_step(state, request)
        sources = _sources(draft.inputs, outputs, inputs)
        if draft.key is None or draft.buffers is not absorb.buffers:
            sources = None
        return state, draft, sources, "replays" if captured else "eager"

    def _update_and_draft(self, absorb: Step, feedback: Feedback) -> Any:
        """``update`` through one graph that also drafts the next step (module docstring); the draft is kept for
        the next :meth:`propose`."""
        request = self._next_request(feedback.roots)
        self._track(absorb.buffers)
        inputs = (*absorb.inputs, feedback.roots)
        key = (("update+draft", absorb.key, request.num_drafts), _spec(inputs))
        if key in self._unfused:
            return self._run(absorb)
        entry = self._graphs.get(key)
        if entry is None:  # first time: run the absorb step alone, see where the draft step's inputs come from
            state, draft, sources, how = self._discover(absorb, inputs, request)
            if sources is None:
                self._unfused.add(key)  # not fusable at this key: the plain update from now on
                self.counts[how] += 1
                return state
            fused = _chain(absorb.fn, draft.fn, draft.inputs, sources, len(absorb.inputs))
            self._graphs[key] = entry = (self.capture(fused, inputs), draft.key)
            self.counts["captures"] += 1
        else:
            self.counts["replays"] += 1
        captured, draft_key = entry
        outputs, draft_outputs = captured.run_matching(inputs)
        state = absorb.finish(outputs)
        draft = self.drafter.draft_step(state, request)
        if draft.key != draft_key:  # the draft would be another graph's: keep the update, draft in propose
            return state
        self._prefetched = (state, feedback.roots, request.num_drafts, draft.finish(draft_outputs))
        return state

    def _folds(self) -> bool:
        """Whether updates may be folded into a caller's captured step: ``fold`` is on, the drafter allows it
        (``folds_drafts``) and the steps are not compiled (a fold runs inside the caller's capture, which does not
        compile the drafter)."""
        return self.fold and getattr(self.drafter, "folds_drafts", False) and not self._compiles()

    def _compiles(self) -> bool:
        """Whether ``capture`` compiles the steps it captures (:func:`specdec.static.compiled_capture`)."""
        return getattr(self.capture, "compile_fn", None) is not None

    def _learn_fold(self, absorb: Step, feedback: Feedback) -> Any:
        """``update`` with ``fold`` on: the absorb step runs as usual; once per key it runs apart from its graph so
        that the next draft step can be built from its state and :meth:`fold_for` learns where that step's inputs
        come from (as :meth:`_update_and_draft` does). The feedback is kept (per ``K``) for its shapes."""
        if feedback.tokens.shape[1] > self.drafter.max_num_drafts + 1:  # a prompt's width: never a step's
            return self._run(absorb)
        self._track(absorb.buffers)
        self._fold_feedback[self._request.num_drafts] = feedback
        key = (absorb.key, _spec(absorb.inputs), self._request.num_drafts)
        if key in self._fold_plans or key in self._unfused:
            return self._run(absorb)
        # the next root positions: inside the fold, the verify step's own (each row's length after the commit)
        positions = torch.zeros_like(feedback.roots)
        request = self._next_request(feedback.roots, positions)
        state, draft, sources, how = self._discover(absorb, (*absorb.inputs, feedback.roots, positions), request)
        self.counts[how] += 1
        if sources is None:
            self._unfused.add(key)
        else:
            self._fold_plans[key] = _FoldPlan(draft.fn, draft.inputs, sources, draft.key)
        return state

    @torch.no_grad()
    def fold_for(self, state: Any, num_drafts: int, device: torch.device) -> Fold | None:
        """The update of a verify step about to run and the draft of the step after it, as work for the caller's
        own captured step (the fast path's greedy verify, :meth:`specdec.static.StaticAdapter.forward_commit`):
        one graph replay a step instead of three, and none of the update's copies and clones.

        Offered for drafters whose greedy draft step reads of a request only ``K``, ``roots`` and
        ``root_positions`` (``folds_drafts``: P-EAGLE, DFlash, DSpark, a fixed-width prompt lookup, which drafts for
        every row as the request has no ``active``; EAGLE-1/2/3 built with ``fold=True``) once
        an ordinary :meth:`update` at this ``K`` has shown where the draft step's inputs come from; the absorb step is
        built here, before the verify, from the last feedback of this ``K`` (its shapes: its ``finish`` must read
        nothing else of it; the drafters' do not), so the cache grows, where it must, before anything runs. The draft
        is returned by the next :meth:`propose` given the state ``finish`` returns, the same ``roots`` tensor and this
        ``K``; any other propose drafts anew. The same kernels run on the same values: float32 results equal the
        unfolded steps' (tested), and so did bf16 drafts in session 30's clean A/Bs on the H200.

        Args:
            state: the drafter state the update would get (the one ``propose`` returned).
            num_drafts: this step's ``K`` (the next draft's too).
            device: where the step runs.

        Returns:
            A :class:`Fold`, or ``None`` (run :meth:`update` after the step as usual): off, not on a captured device,
            a drafter that does not draft ahead, nothing learnt yet at this key, or an absorb input that is neither
            the feedback's nor the state's (a tensor made from the feedback cannot be read from a template).
        """
        template = self._fold_feedback.get(num_drafts)
        if template is None or self._request is None or not self._folds() or not self._captures_on(device):
            return None
        absorb = self.drafter.absorb_step(state, template)
        if absorb.key is None:
            return None
        self._track(absorb.buffers)
        spec = _spec(absorb.inputs)
        plan = self._fold_plans.get((absorb.key, spec, num_drafts))
        if plan is None:
            return None
        from_feedback = {id(t): i for i, t in enumerate(_leaves(template))}
        from_state = {id(t) for t in _leaves(state)}
        picks, extra = [], []
        for t in _leaves(absorb.inputs):
            if id(t) in from_feedback:
                picks.append(("feedback", from_feedback[id(t)]))
            elif id(t) in from_state:
                picks.append(("state", len(extra)))
                extra.append(t)
            else:
                return None
        if plan.picks != picks:  # the caller captures run once per key: build it once per layout
            absorb_inputs = absorb.inputs
            chained = _chain(absorb.fn, plan.draft_fn, plan.draft_inputs, plan.sources, len(absorb_inputs))

            def run(feedback: Feedback, root_positions: torch.Tensor, *state_tensors: torch.Tensor
                    ) -> tuple[Any, Any]:
                pools = {"feedback": _leaves(feedback), "state": state_tensors}
                leaves = iter([pools[kind][i] for kind, i in picks])
                return chained(*_map(lambda _: next(leaves), absorb_inputs), feedback.roots, root_positions)
            plan = self._fold_plans[(absorb.key, spec, num_drafts)] = plan._replace(picks=picks, run=run)
        draft_key = plan.draft_key

        def finish(outputs: tuple[Any, Any], roots: torch.Tensor, root_positions: torch.Tensor) -> Any:
            absorbed, drafted = _map(torch.Tensor.clone, outputs)  # the caller's next replay overwrites them
            new_state = absorb.finish(absorbed)
            self.counts["folded"] += 1
            request = self._next_request(roots, root_positions)._replace(num_drafts=num_drafts)
            draft = self.drafter.draft_step(new_state, request)
            if draft.key == draft_key:
                self._prefetched = (new_state, roots, num_drafts, draft.finish(drafted))
            return new_state

        self._prefetched = None
        key = ("fold", absorb.key, spec, num_drafts, draft_key, tuple(picks), self._buffer_ids)
        return Fold(key=key, extra=tuple(extra), run=plan.run, finish=finish)


class _FoldPlan(NamedTuple):
    """What :meth:`GraphedDrafter.fold_for` learnt at a key: the draft step's function, inputs (their structure) and
    their sources (:func:`_sources`) and key; then, once a fold was built, where the absorb step's inputs come from
    (``picks``) and the function the caller captures (``run``)."""

    draft_fn: Callable[..., Any]
    draft_inputs: Any
    sources: list
    draft_key: Hashable
    picks: list | None = None
    run: Callable[..., Any] | None = None


class Fold(NamedTuple):
    """A drafter's update and next draft as work for a caller's captured step (:meth:`GraphedDrafter.fold_for`).

    Attributes:
        key: names the work (the caller captures once per key): the absorb and draft steps' keys, the absorb
            inputs' spec, ``K`` and the drafter's buffers.
        extra: the drafter's state tensors the work reads: the caller copies them into its captured inputs at
            every call and passes them to ``run`` after the feedback.
        run: ``run(feedback, root_positions, *extra) -> outputs``, inside the capture: the absorb step on
            ``feedback`` (a :class:`~specdec.drafters.Feedback` of the caller's captured tensors), then the draft
            step for the next request (its roots ``feedback.roots``, its root positions ``root_positions``: each
            row's length after the commit, ``[B]``); no host sync.
        finish: ``finish(outputs, roots, root_positions) -> state``, on the host after the caller's step ran: the
            two steps' bookkeeping; ``roots`` is the tensor the next request will carry (the draft waits for it),
            ``root_positions`` the new lengths.
    """

    key: Hashable
    extra: tuple
    run: Callable[..., Any]
    finish: Callable[[Any, torch.Tensor], Any]


def _sources(targets, outputs, inputs) -> list[tuple[str, int]] | None:
    """For each tensor of ``targets``: ``("out", i)`` when it *is* leaf ``i`` of ``outputs``, else ``("in", i)`` when
    it is leaf ``i`` of ``inputs``; ``None`` when one is neither."""
    out_ids = {id(t): i for i, t in enumerate(_leaves(outputs))}
    in_ids = {id(t): i for i, t in enumerate(_leaves(inputs))}
    found = []
    for t in _leaves(targets):
        if id(t) in out_ids:
            found.append(("out", out_ids[id(t)]))
        elif id(t) in in_ids:
            found.append(("in", in_ids[id(t)]))
        else:
            return None
    return found


def _chain(first: Callable, second: Callable, second_inputs, sources: list[tuple[str, int]], n_first: int
           ) -> Callable:
    """``fn(*inputs) -> (first(*inputs[:n_first]), second(*args))`` with ``second``'s arguments (shaped as
    ``second_inputs``) gathered from ``first``'s outputs and ``inputs`` as ``sources`` says."""
    def chained(*inputs):
        outputs = first(*inputs[:n_first])
        pools = {"out": _leaves(outputs), "in": _leaves(inputs)}
        picked = iter([pools[kind][i] for kind, i in sources])
        args = _map(lambda _: next(picked), second_inputs)
        return outputs, second(*args)

    return chained


def _reads_only(captured: CapturedStep) -> bool:
    """Whether a step, captured and run once, wrote its static inputs only by the one copy of the call's inputs into
    them (each version counter at 1: the warm-up, capture and eager runs of a step that writes an input count too):
    only then may a variant of it read a caller's tensors where they lie."""
    try:
        return all(t._version == 1 for t in _leaves(getattr(captured, "inputs", None)))
    except RuntimeError:  # inference tensors keep no version counter: assume the worst
        return False


def _where(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.stride()


class _InPlace:
    """The variants of one captured step that read its stable inputs where they lie (:attr:`GraphedDrafter.in_place`).

    An input leaf is *stable* when it lies in the outputs of another captured step alive (memory every replay of
    that step writes: the fast path's verify outputs) and not in the drafter's buffers (which the step may write:
    those are read as copies). A variant captured for a call's stable leaves (their addresses and strides) replays
    with only the other leaves copied in. Reading a tensor where it lies inside a replay reads what a copy queued
    just before the replay would have read: its value after everything queued earlier, before anything queued
    later. A variant keeps a reference to the tensors it reads, so their memory cannot be handed to another tensor
    while it lives: a match of addresses is a match of tensors. At most :attr:`MAX_VARIANTS` are held per step (the
    oldest dropped); after :attr:`MAX_DROPPED` drops the step stops making variants (its inputs keep moving).
    """

    MAX_VARIANTS = 4
    MAX_DROPPED = 8

    def __init__(self, allowed: bool, own: frozenset = frozenset()):
        self.allowed = allowed
        self.variants: dict = {}  # ((position, (address, strides)), ...) -> (captured step, pinned tensors)
        self.hot: tuple | None = None  # the variant used last: (its key, captured step, the leaves it copies)
        self.dropped = 0
        self.own = frozenset(own)  # the storages of this step's own outputs (its graphs'): never read in place

    def run(self, step: Step, buffer_storages: frozenset, capture: Callable, counts: dict, clone: bool = True
            ) -> Any:
        """The step's outputs from a variant (``None``: none applies; the caller replays the copying graph);
        ``clone=False``: the variant's own output tensors (``Step.owned_outputs``)."""
        if not self.allowed:
            return None
        leaves = _leaves(step.inputs)
        if self.hot is not None:  # the common case: the variant of the last call applies again
            stable, captured, copied = self.hot
            if all(_where(leaves[i]) == w for i, w in stable):
                counts["in_place"] += 1
                return captured.run_matching([leaves[i] for i in copied], clone=clone)
        stable = tuple((i, _where(t)) for i, t in enumerate(leaves) if _held(t, buffer_storages | self.own))
        if not stable:
            return None
        entry = self.variants.get(stable)
        if entry is None:
            if self.dropped >= self.MAX_DROPPED:
                return None
            if len(self.variants) >= self.MAX_VARIANTS:
                oldest = next(iter(self.variants))
                if self.hot is not None and self.hot[0] == oldest:
                    self.hot = None
                del self.variants[oldest]
                self.dropped += 1
            pinned = {i: leaves[i] for i, _ in stable}
            entry = self.variants[stable] = (capture(step, pinned), pinned)
        captured, pinned = entry
        copied = [i for i in range(len(leaves)) if i not in pinned]
        self.hot = (stable, captured, copied)
        counts["in_place"] += 1
        outputs = captured.run_matching([leaves[i] for i in copied], clone=clone)
        self.own |= _storages(getattr(captured, "outputs", None))
        return outputs


def _storages(tree) -> frozenset:
    """The storage addresses of a tree's tensors."""
    return frozenset(t.untyped_storage().data_ptr() for t in _leaves(tree))


def cuda_graphed(drafter: GraphableDrafter) -> GraphedDrafter:
    """Wrap a drafter so that its steps run as CUDA graphs on CUDA (eagerly elsewhere).

    Args:
        drafter: a :class:`GraphableDrafter` (e.g. :class:`~specdec.drafters.EagleDrafter`).

    Returns:
        A :class:`GraphedDrafter`; it implements the :class:`~specdec.drafters.Drafter` protocol.

    Example:
        >>> drafter = cuda_graphed(EagleDrafter(head, DynamicTree()))      # doctest: +SKIP
        >>> out = specdec.generate(target, ids, drafter=drafter)           # doctest: +SKIP
    """
    return GraphedDrafter(drafter)
