"""The fast path's target adapter: a preallocated KV cache and one captured target forward per padded size.

:class:`StaticAdapter` has the public surface of :class:`~specdec.adapter.ModelAdapter` (``prefill``, ``decode``,
``forward``, ``commit``, ``check_positions``, ``vocab_size``, ``feature_layers``, ``max_positions``), so
:func:`specdec.step.step` and :func:`specdec.generate` drive it unchanged; ``generate(..., fast=True)`` picks it
(through :func:`target_adapter`).

Cache layout, per row (``Lmax`` slots, preallocated once)::

    [ committed slots (Lc, some invalid: left padding, holes) | pending slots (P) | free slots ]

exactly :class:`~specdec.adapter.ModelAdapter`'s layout, inside tensors that never move: every row shares the write
pointer ``Lc`` (a host int), per-row holes are masked through the ``valid`` buffer ``[B, Lmax]``. Attention always
spans all ``Lmax`` keys under an additive 4-D mask ``[B, 1, M, Lmax]`` (built by :func:`specdec.kernels.tree_mask`
into a preallocated buffer; free slots are hidden), so every forward of a given padded size has the same shapes.

**Why our own small cache, not HF's ``StaticCache``.** Our :func:`slot_cache` (an HF ``Cache``
of :class:`SlotLayer` s) writes the new keys/values at the slots held in one index tensor that the adapter sets
before each forward (``index_copy_`` into the preallocated tensors) and returns the full tensors. HF's
``StaticCache`` takes its write positions from ``cache_position`` / ``position_ids`` — but tree nodes share
positions (siblings have equal depths) and rows hold holes, so slot and position differ; its constructor,
``cache_position`` plumbing and lazy initialisation also changed between transformers 5.17 and 5.24, while the
``Cache(layers=[...])`` constructor and ``Cache.update(keys, values, layer_idx, ...)`` -> ``layer.update(...)``
protocol are the same in both. Given a 4-D mask, HF's ``create_causal_mask`` returns it as is in both versions, so
the cache is asked for nothing but ``update``.

**Buckets.** A forward of ``M`` nodes is padded to the smallest bucket ``>= M`` (default
:data:`DEFAULT_BUCKETS`); padding nodes are absent (they see only themselves, write to free slots and are never
kept). On CUDA each bucket's forward is captured once as a CUDA graph (:func:`specdec.graphs.capture_graph`: its
inputs are the tokens, positions, mask and write slots) and replayed; the prompt's prefill runs eagerly (HF's own
pass on a ``DynamicCache``, copied into the static tensors once, so prefill logits equal the eager path's bit for
bit). Elsewhere (CPU) the same code runs eagerly (:func:`specdec.graphs.capture_graph_ref`), so CPU tests cover
the logic. A forward larger than the largest bucket runs eagerly at its own size.

**Commit** moves the accepted path in place inside the static tensors (:func:`specdec.kernels.compact_kv` with
``inplace=True``: the kernel and its reference both store into the given tensors), so captured graphs stay
valid; then ``Lc += A`` and ``valid`` is updated in place. No host sync happens inside ``forward``/``commit``
beyond ModelAdapter's (``commit`` takes ``prefix`` from the caller, as :func:`specdec.step.step` passes it).

**Compilation** is the caller's: ``capture=compiled_capture()`` compiles each bucket's forward with
``torch.compile`` before capturing it (off by default: the graphs remove the launch cost, compiling adds fusion at
the price of minutes of compile time per shape on a 7B model).

**Capacity.** ``Lmax`` is fixed at construction (:func:`capacity_for`); a forward that would pass it raises
:class:`CapacityError` (never wraps around).

States are consumed as in :class:`~specdec.adapter.CacheState` (the buffers are updated in place).

References:
    gpt-fast (static KV cache + ``torch.compile(mode="reduce-overhead")``); NVIDIA CUDA Graphs; EAGLE-2
    (Li et al., arXiv 2406.16858) for the tree forward being verified.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from .adapter import ForwardOutput, ModelAdapter, UnsupportedModelError, _consume, _Ticket
from .fused import FusedDecoder, decode_settings, fused_support
from .graphs import (
    BoundMark,
    CapturedStep,
    _spec,
    capture_graph,
    capture_graph_ref,
    copy_changed,
    mark_bound,
    settle_bound,
)
from .kernels import KVCompactPlan, kept_at_ends, tree_mask, tree_mask_at

__all__ = ["DEFAULT_BUCKETS", "CapacityError", "SlotLayer", "slot_cache", "StaticAdapter", "StaticCacheState",
           "COMPILE_CAPACITY_MULTIPLE", "bucket_for", "capacity_for", "compiled_capture", "static_support",
           "target_adapter", "fast_drafter", "graphed_wrappers", "release_graphs", "fast_mode", "use_fused",
           "PREFILL_GRAPHS", "held_graphs"]

#: Padded token counts of the captured target forwards (1: plain steps; the rest: trees).
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

#: Prompt shapes whose fused prefill is kept captured (the most recent ones); a shape is captured when it comes
#: back (its second prefill), so workloads of all-different prompt lengths never pay a capture.
PREFILL_GRAPHS = 4


_FUSED_DEFAULT: list[bool | None] = [None]


@contextlib.contextmanager
def use_fused(enabled: bool | None):
    """Within the block, static adapters built with ``fused=None`` (as ``generate(fast=...)`` builds them) take
    ``enabled``: ``False`` runs HF's modules, ``True`` requires :class:`~specdec.fused.FusedDecoder`, ``None``
    restores the automatic choice. For ablations of the fused decoder.

    Args:
        enabled: ``True``, ``False`` or ``None``.

    Example:
        >>> with use_fused(False):                                   # doctest: +SKIP
        ...     out = generate(model, ids, drafter=drafter, fast=True)
    """
    if enabled not in (None, True, False):
        raise ValueError(f"use_fused takes True, False or None, got {enabled!r}")
    before = _FUSED_DEFAULT[0]
    _FUSED_DEFAULT[0] = enabled
    try:
        yield
    finally:
        _FUSED_DEFAULT[0] = before


class CapacityError(ValueError):
    """A forward would write past the static cache's ``Lmax`` slots."""


def bucket_for(num_nodes: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ``>= num_nodes``, or ``num_nodes`` itself when it exceeds every bucket.

    Args:
        num_nodes: ``M``, nodes of one forward.
        buckets: the padded sizes, ascending.

    Returns:
        The padded size.
    """
    return next((b for b in buckets if b >= num_nodes), num_nodes)


COMPILE_CAPACITY_MULTIPLE = 256
"""Alignment of ``generate(fast="compile")``'s cache capacity (``fast=True`` aligns to 64)."""


def capacity_for(prompt_len: int, max_new_tokens: int, max_nodes: int, *, multiple: int = 64) -> int:
    """``Lmax``: ``round_up(prompt_len + max_new_tokens + max_nodes + 1, multiple)``.

    Args:
        prompt_len: ``T``, the (padded) prompt length.
        max_new_tokens: new tokens per row.
        max_nodes: the largest padded forward (a bucket) that may run on top of the committed tokens.
        multiple: alignment of ``Lmax`` (64 keeps the mask rows aligned for SDPA).

    Returns:
        The number of cache slots.
    """
    return math.ceil((prompt_len + max_new_tokens + max_nodes + 1) / multiple) * multiple


class SlotLayer:
    """One attention layer's preallocated keys and values; ``update`` writes the new entries at ``cache.slots``.

    Args:
        cache: the owning cache (:func:`slot_cache`; holds the write slots).
        keys: Shape ``[B, heads, Lmax, head_dim]``, preallocated.
        values: Shape ``[B, heads, Lmax, head_dim]``, preallocated.
    """

    is_sliding = False
    is_compileable = True

    def __init__(self, cache, keys: torch.Tensor, values: torch.Tensor):
        self._cache = weakref.ref(cache)
        self.keys, self.values = keys, values
        self.is_initialized = True
        self.device, self.dtype = keys.device, keys.dtype

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``[B, heads, M, d]`` new keys/values at slots ``cache.slots`` (``[M]``); return the full tensors."""
        slots = self._cache().slots
        self.keys.index_copy_(2, slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, slots, value_states.to(self.values.dtype))
        return self.keys, self.values

    def lazy_initialization(self, key_states, value_states) -> None:  # preallocated: nothing to do
        """No-op (the tensors are preallocated)."""

    def get_seq_length(self) -> int:
        """Slots held (``Lmax``; the adapter tracks the committed length itself)."""
        return self.keys.shape[2]

    def get_max_length(self) -> int:
        """``Lmax``."""
        return self.keys.shape[2]

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` = ``(Lmax, 0)``: attention spans every slot."""
        return self.keys.shape[2], 0

    def reset(self) -> None:
        """Zero the tensors (in place)."""
        self.keys.zero_()
        self.values.zero_()


@functools.cache
def _slot_cache_type() -> type:
    """The ``transformers.Cache`` subclass behind :func:`slot_cache` (transformers is imported on first use)."""
    from transformers import Cache

    class SlotCache(Cache):
        """An HF ``Cache`` over preallocated tensors, written at ``slots`` (see :func:`slot_cache`)."""

        def __init__(self, shapes, device):
            super().__init__(layers=[])
            for shape, dtype in shapes:
                self.layers.append(SlotLayer(self, torch.zeros(shape, dtype=dtype, device=device),
                                             torch.zeros(shape, dtype=dtype, device=device)))
            self.slots = torch.zeros(1, dtype=torch.long, device=device)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            """``Lmax`` (positions are always passed explicitly)."""
            return self.layers[layer_idx].get_seq_length()

        @property
        def is_compileable(self) -> bool:
            """Static shapes: yes."""
            return True

    SlotCache.__module__ = __name__
    return SlotCache


def slot_cache(shapes: Sequence[tuple[tuple[int, ...], torch.dtype]], device: torch.device):
    """An HF ``Cache`` of :class:`SlotLayer` s over zeroed preallocated tensors.

    ``cache.slots`` (Shape ``[M]`` int64) says where the next forward's ``M`` tokens are written; the adapter sets
    it before each forward.

    Args:
        shapes: one ``(keys_shape, dtype)`` per layer, ``keys_shape = (B, heads, Lmax, head_dim)``.
        device: where to allocate.

    Returns:
        A ``transformers.Cache`` instance (class ``SlotCache``).
    """
    return _slot_cache_type()(shapes, device)


def compiled_capture(capture: Callable[..., CapturedStep] = capture_graph, **compile_kwargs
                     ) -> Callable[..., CapturedStep]:
    """A capture function for :class:`StaticAdapter` that applies ``torch.compile`` to each bucket's forward first.

    Compilation is the caller's choice (as in gpt-fast): ``StaticAdapter(model, capacity=..., capture=
    compiled_capture())`` compiles the forward (``dynamic=False``: one compiled graph per bucket and batch size,
    so mind dynamo's recompile limit) and captures the compiled kernels as a CUDA graph; the warm-up runs of
    :func:`~specdec.graphs.capture_graph` do the compiling, outside the capture.

    Args:
        capture: the capture to apply after compiling (:func:`~specdec.graphs.capture_graph`, or
            :func:`~specdec.graphs.capture_graph_ref` to run the compiled function without graphs).
        **compile_kwargs: passed to ``torch.compile`` (e.g. ``backend=``, ``mode=``); without any of
            ``backend`` / ``mode`` / ``options``, inductor runs with ``coordinate_descent_tuning`` (gpt-fast's
            setting: it tunes the reductions of one-token matmuls; it lengthens compiling).

    Returns:
        ``capture_fn(fn, inputs) -> CapturedStep``.
    """
    if not {"backend", "mode", "options"} & set(compile_kwargs):  # gpt-fast's inductor setting: tuned reductions
        compile_kwargs["options"] = {"coordinate_descent_tuning": True}

    def compile_fn(fn):
        _raise_recompile_limits()
        return torch.compile(fn, dynamic=False, **compile_kwargs)

    def capture_compiled(fn, inputs):
        return capture(compile_fn(fn), inputs)
    # StaticAdapter.forward_commit compiles the model's forward alone and captures it with eager kernels after it
    capture_compiled.compile_fn, capture_compiled.capture = compile_fn, capture
    return capture_compiled


def _raise_recompile_limits(limit: int = 64) -> None:
    """Let dynamo keep one compiled graph per bucket and batch size: every bucket's forward is the same Python
    function (one code object), and past dynamo's default limit of 8 it would silently fall back to eager."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(config, name) and getattr(config, name) < limit:
            setattr(config, name, limit)
    for name in ("accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(config, name) and getattr(config, name) < 4 * limit:
            setattr(config, name, 4 * limit)


class StaticCacheState(NamedTuple):
    """The static cache's bookkeeping (the tensors live in the adapter's buffers).

    A state is **consumed** by the adapter call it is passed to; reusing it raises
    :class:`~specdec.adapter.ConsumedStateError`.

    Attributes:
        valid: Shape ``[B, Lmax]`` bool, the adapter's buffer: slot ``s < Lc`` holds a real token (updated in place).
        committed: ``Lc``, committed slots (host int; every row shares the write pointer).
        lengths: Shape ``[B]`` int64, committed tokens per row (= position id of the next token).
        pending_parents: Shape ``[B, P]`` int64, as :class:`~specdec.adapter.CacheState`.
        pending_present: Shape ``[B, P]`` bool, as :class:`~specdec.adapter.CacheState`.
        ticket: the consumption guard.
        ends: Shape ``[B]`` int64 (the adapter's buffer), after a late commit: each row's first slot past its last
            committed token (``<= Lc``; ``Lc`` is then only an upper bound of their maximum); ``None``: every row
            ends at ``Lc``.
        mark: after a late commit, a copy of ``ends`` on its way to the host (:func:`~specdec.graphs.mark_bound`,
            one at a time), which lets a later forward lower ``Lc`` back to the true longest row without a host sync.
        dense: every row's valid committed slots are exactly those from its prompt's first real token (the
            adapter's ``starts[b]``: left padding before it) to its end (``ends[b]``; ``Lc`` while ``ends`` is
            ``None``): no holes. A left-padded (or unpadded) prompt starts dense and late commits keep it so; a
            commit at ``Lc`` or a plain step after a late commit may leave holes and end it, and so does a prompt
            mask that is not left padding. The fused decoder's tree attention then reads no mask for those slots
            and none of the padding (``visible_end``, ``kv_start``).
    """

    valid: torch.Tensor
    committed: int
    lengths: torch.Tensor
    pending_parents: torch.Tensor
    pending_present: torch.Tensor
    ticket: _Ticket | None = None
    ends: torch.Tensor | None = None
    mark: BoundMark | None = None
    dense: bool = False

    @property
    def committed_valid(self) -> torch.Tensor:
        """Shape ``[B, Lc]`` bool: which committed slots hold real tokens (a view of ``valid``)."""
        return self.valid[:, :self.committed]

    @property
    def num_pending(self) -> int:
        """``P``: slots written since the last commit."""
        return self.pending_parents.shape[1]


class _Plain:
    """The plain step's captured forward (bucket 1) and what lets its mask row be updated one column at a time.

    Between two plain steps the committed columns of the mask row do not change, except the previous step's own
    column, which it already made visible: so when the previous forward on these buffers was a plain step at
    ``Lc - 1`` (``at``), this step only makes its own column ``Lc`` visible, inside the captured forward.
    """

    __slots__ = ("runner", "tokens", "positions", "at", "high")

    def __init__(self) -> None:
        self.runner: CapturedStep | None = None
        self.tokens = self.positions = None  # [B] views of the runner's [B, 1] token and position inputs
        self.at: int | None = None           # Lc of the last plain step whose mask row is still current
        self.high = 0                        # first mask column never written as visible since the last rebuild


class _Buffers(NamedTuple):
    """One batch size's preallocated tensors and the graphs captured on them."""

    cache: object          # slot_cache(...)
    valid: torch.Tensor    # [B, Lmax] bool
    runners: dict          # bucket -> CapturedStep
    high_water: dict       # bucket -> first mask column never written as visible since the last reset
    arange: torch.Tensor   # [largest bucket] int64, for the write slots
    consts: dict           # constant tensors of this batch size (padding parents, empty pending), made once
    plain: _Plain          # the plain step's forward
    ends: torch.Tensor     # [B] int64, each row's end after late commits (StaticCacheState.ends)
    starts: torch.Tensor   # [B] int64, each row's first real slot after a left-padded prefill (its padding before)
    dtype: torch.dtype     # the cache's (= the model's) dtype, of the masks (read once: model.dtype walks params)
    prefills: dict         # (B, T, all_valid, last_only) -> CapturedStep of the fused prefill (at most PREFILL_GRAPHS)
    compact: KVCompactPlan  # compact_kv in place over these very tensors, checked and grouped once
    seen: dict             # (B, T, all_valid, last_only) -> prefills of that shape run so far
    prefix_end: torch.Tensor  # [1] int64, the committed slots' count of the bucket forward in flight (see _model_fn)


class _Store:
    """Where an adapter keeps its buffers; shared between adapters of one model (see :func:`target_adapter`).

    It references no model, so keeping it per model (weakly keyed) never keeps the model alive: a CUDA graph
    replay references its memory, not the Python objects it was captured from.
    """

    __slots__ = ("buffers", "live", "fused", "params", "counts")

    def __init__(self) -> None:
        self.counts = {"builds": 0, "captures": 0}  # see StaticAdapter.counts
        self.buffers: _Buffers | None = None
        self.live: _Ticket | None = None  # the ticket of the newest state on these buffers: a prefill spends it
        self.fused = None                 # the FusedDecoder the graphs were captured on (None: HF's modules)
        self.params: tuple = ()           # the model's parameters (id, address, dtype) when the graphs were captured


def _counted(capture: Callable[..., CapturedStep], counts: dict) -> Callable[..., CapturedStep]:
    """``capture`` counting its calls in ``counts["captures"]``, with :func:`compiled_capture`'s attributes
    (``compile_fn``; ``capture``, the uncompiled capture, counted too)."""
    def counted(fn, inputs):
        counts["captures"] += 1
        return capture(fn, inputs)

    counted.compile_fn = getattr(capture, "compile_fn", None)
    if getattr(capture, "capture", None) is not None:
        counted.capture = _counted(capture.capture, counts)
    return counted


def static_support(model: nn.Module) -> str | None:
    """Why ``model`` cannot run on the static path, or ``None`` when it can.

    The static path needs full attention in every layer through HF's ``Cache.update`` (no sliding window, no
    linear-attention / hybrid layers), a model that declares static shapes (``_can_compile_fullgraph``), and a
    forward without host syncs (no ``dynamic`` / ``longrope`` RoPE, which reads ``max(position_ids)``).

    Args:
        model: an HF causal LM.

    Returns:
        A short reason, or ``None``.
    """
    config = getattr(model, "config", None)
    if getattr(model, "_can_compile_fullgraph", True) is False:
        return f"{type(model).__name__} declares no static-shape support (_can_compile_fullgraph=False)"
    types = getattr(config, "layer_types", None)
    if types is not None and any(t != "full_attention" for t in types):
        kinds = sorted({t for t in types if t != "full_attention"})
        return f"its layers are not all full attention ({', '.join(kinds)})"
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if window is not None:
        return f"it uses a sliding window ({window})"
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    for name in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, name, None)
        kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        if kind in ("dynamic", "longrope"):  # their frequencies follow max(position_ids): a host sync per forward
            return f"its {kind} RoPE reads the longest position on the host at every forward"
    return None


class StaticAdapter:
    """Run an HF causal LM on trees of tokens over a preallocated KV cache, one captured forward per bucket.

    Same surface as :class:`~specdec.adapter.ModelAdapter` (see the module docstring for the layout).

    Args:
        model: any ``transformers`` causal LM with full attention (``sdpa`` or ``eager``); see
            :func:`static_support`.
        feature_layers: HF ``hidden_states`` indices to return.
        capacity: ``Lmax``, cache slots per row (:func:`capacity_for`).
        buckets: padded forward sizes (ascending); forwards larger than the last run eagerly.
        fused: run the forwards after the prefill with :class:`~specdec.fused.FusedDecoder` (fused projections,
            gpt-fast style; it holds copies of the fused weights): ``None`` (default) when
            :func:`~specdec.fused.fused_support` accepts the model, else HF's modules; ``True`` requires it;
            ``False`` always runs HF's modules (:func:`use_fused` sets what ``None`` means within a block).
        capture: how to capture a bucket's forward (default: :func:`~specdec.graphs.capture_graph` on CUDA,
            eager :func:`~specdec.graphs.capture_graph_ref` elsewhere).
        role: how errors name the model.

    Raises:
        UnsupportedModelError: as :class:`~specdec.adapter.ModelAdapter`; or ``fused=True`` for a model the fused
            decoder does not cover.
        ValueError: ``capacity`` is not a positive int or a bucket is not a positive int.

    Example:
        >>> ad = StaticAdapter(model, capacity=capacity_for(T, 64, 64))      # doctest: +SKIP
        >>> out, state = ad.prefill(input_ids, attention_mask)               # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, feature_layers: tuple[int, ...] = (), *, capacity: int,
                 buckets: Sequence[int] = DEFAULT_BUCKETS, capture: Callable[..., CapturedStep] | None = None,
                 role: str = "target", fused: bool | None = None):
        self._eager = ModelAdapter(model, feature_layers, role=role)
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None (automatic), True or False, got {fused!r}")
        if fused is None:
            fused = _FUSED_DEFAULT[0]
        reason = fused_support(model) if fused is not False else "fused=False"
        if fused is True and reason is not None:
            raise UnsupportedModelError(f"{type(model).__name__} cannot run on the fused decoder: {reason}; pass "
                                        f"fused=None or fused=False to run HF's modules on the static path")
        self.fused = reason is None
        if not isinstance(capacity, int) or capacity < 2:
            raise ValueError(f"capacity must be an int >= 2 (cache slots per row, see capacity_for), got {capacity!r}")
        if not buckets or any(not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"buckets must be positive ints, e.g. {DEFAULT_BUCKETS}, got {buckets!r}")
        self.model = model
        self.capacity = capacity
        self.buckets = tuple(sorted(set(buckets)))
        self._capture = capture
        self._counted_capture = None  # (counts, on CUDA, the capture counting into them): see _capture_fn
        self._store = _Store()

    # ------------------------------------------------------------------ ModelAdapter's read-only surface
    @property
    def feature_layers(self) -> tuple[int, ...]:
        """HF ``hidden_states`` indices returned as features."""
        return self._eager.feature_layers

    @property
    def vocab_size(self) -> int | None:
        """``V``: the width of the model's logits."""
        return self._eager.vocab_size

    @property
    def max_positions(self) -> int | None:
        """The model's ``max_position_embeddings``."""
        return self._eager.max_positions

    @property
    def captured_buckets(self) -> list[int]:
        """The buckets whose forward has been captured for the current batch size."""
        buf = self._store.buffers
        if buf is None:
            return []
        sizes = {key if isinstance(key, int) else key[1] for key in buf.runners}  # ("commit", size, ...) keys too
        return sorted(sizes | ({1} if buf.plain.runner is not None else set()))

    def check_positions(self, max_position: int) -> None:
        """Raise a clear error if ``max_position`` is past what the model supports."""
        self._eager.check_positions(max_position)

    # ------------------------------------------------------------------ buffers
    def _cache_shapes(self, dynamic_cache, batch: int) -> list:
        """``(keys_shape, dtype)`` per layer for the static tensors, from HF's cache after its prefill."""
        shapes = []
        for layer in dynamic_cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or getattr(layer, "is_sliding", False):
                raise UnsupportedModelError(
                    f"{type(self.model).__name__}: a cache layer is not a full-attention key/value layer, so the "
                    f"static path cannot hold it; call generate(..., fast=False) for this model")
            shapes.append(((batch, keys.shape[1], self.capacity, keys.shape[3]), keys.dtype))
        return shapes

    def _ensure_buffers(self, shapes: list, batch: int, device: torch.device) -> _Buffers:
        """The buffers for this batch size and layer shapes (reused, graphs included, when they match)."""
        store, buf = self._store, self._store.buffers
        params = _param_ids(self.model)
        same_params = store.params == params  # a replaced, moved or cast parameter: the graphs read the old memory
        if store.fused is not None and same_params:
            store.fused.sync()  # weights updated in place: copied again into the fused tensors
        settings = decode_settings()
        same_kernels = store.fused is None or store.fused.settings == settings
        if not same_kernels:  # decode_kernels() changed since the graphs were captured: capture them again
            store.fused.use_settings(settings)
        if buf is not None:
            same = [(tuple(la.keys.shape), la.keys.dtype) for la in buf.cache.layers] == shapes
            if (same and same_params and same_kernels and self.fused == (store.fused is not None)
                    and buf.valid.device == device):
                return buf
        rows = self.capacity + self.buckets[-1]  # RoPE table rows the forwards may read
        keep = self.fused and same_params and store.fused is not None and store.fused.cos.shape[0] >= rows
        if not keep:  # the fused copies are remade only when the weights or the positions need it
            store.fused = FusedDecoder(self.model, rows) if self.fused else None
        store.params = params
        cache = slot_cache(shapes, device)
        valid = torch.zeros(batch, self.capacity, dtype=torch.bool, device=device)
        store.counts["builds"] += 1
        self._store.buffers = _Buffers(cache=cache, valid=valid, runners={}, high_water={},
                                       arange=torch.arange(self.buckets[-1], device=device), consts={},
                                       plain=_Plain(), ends=torch.zeros(batch, dtype=torch.long, device=device),
                                       starts=torch.zeros(batch, dtype=torch.long, device=device),
                                       dtype=shapes[0][1], prefills={}, seen={},
                                       prefix_end=torch.zeros(1, dtype=torch.long, device=device),
                                       compact=KVCompactPlan([la.keys for la in cache.layers],
                                                             [la.values for la in cache.layers]))
        return self._store.buffers

    def _capture_fn(self) -> Callable[..., CapturedStep]:
        counts, cuda = self._store.counts, self._store.buffers.valid.device.type == "cuda"
        held = self._counted_capture  # made once per store and device: the forwards ask for it at every step
        if held is not None and held[0] is counts and held[1] == cuda:
            return held[2]
        if self._capture is not None:
            capture = self._capture
        elif cuda:
            capture = capture_graph
        else:
            capture = functools.partial(capture_graph_ref, warmup=0)
        self._counted_capture = (counts, cuda, _counted(capture, counts))
        return self._counted_capture[2]

    @property
    def counts(self) -> dict[str, int]:
        """What the held buffers cost so far (a copy): ``builds`` (buffers allocated: each drops every graph held
        on the old ones) and ``captures`` (target forwards captured: bucket steps, plain steps, prefills). On
        CUDA the counters live with the buffers, which later calls share (:func:`held_graphs`)."""
        return dict(self._store.counts)

    def _model_fn(self, buf: _Buffers, visible: bool = False) -> Callable:
        """``run(tokens, positions, mask, slots) -> (logits, features)``: one forward writing at ``slots``, through
        the fused decoder or HF's modules. The fused decoder also reads ``buf.prefix_end``, the committed slots'
        count (:meth:`_bucket_inputs` writes it): every tree node sees them alike (a padding node, hidden from them
        by the mask, is not read), so its tree attention may read one mask row there (``prefix_end`` of
        :func:`specdec.kernels.tree_attention`). ``visible`` (a dense state, :attr:`StaticCacheState.dense`): it
        reads ``buf.ends`` and ``buf.starts`` instead, each row's end and first real slot, between which every slot
        is seen (``visible_end``: no mask read there; ``kv_start``: the padding before it not read at all)."""
        fused, layers, cache = self._store.fused, self.feature_layers, buf.cache
        if fused is not None:
            bound = dict(visible_end=buf.ends, kv_start=buf.starts) if visible else dict(prefix_end=buf.prefix_end)
            return lambda tokens, positions, mask, slots: fused(tokens, positions, mask, slots, cache.layers, layers,
                                                                **bound)

        def run(tokens, positions, mask, slots):
            cache.slots = slots
            out = self._eager._run(tokens, mask, positions, cache, tree=True)
            return out.logits, out.features
        return run

    def _plain_fn(self, buf: _Buffers) -> Callable:
        """The plain step's captured function: its own mask column and valid slot set in place, one model call,
        and the argmax of its logits; returns ``(logits, features, argmax)``."""
        valid, model = buf.valid, self._model_fn(buf)

        def run(tokens, positions, mask, slots):
            mask.index_fill_(-1, slots, 0.0)  # the token sees itself (the committed columns are already right)
            valid.index_fill_(1, slots, True)  # kept at once: nothing to compact after a plain step
            logits, feats = model(tokens, positions, mask, slots)
            return logits, feats, logits[:, -1].argmax(-1)
        return run

    @staticmethod
    def _const(buf: _Buffers, key, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``buf.consts[key]``, made by ``make()`` on first use (constant tensors of the batch size)."""
        value = buf.consts.get(key)
        if value is None:
            value = buf.consts[key] = make()
        return value

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *, last_logits_only: bool = True) -> tuple[ForwardOutput, StaticCacheState]:
        """Run the prompt eagerly and keep its keys/values in the static cache.

        With the fused decoder (:attr:`fused`), its :meth:`~specdec.fused.FusedDecoder.prefill` writes them in
        place (causal attention over the prompt); a prompt shape (batch, length, padding or not) met before runs
        as a captured graph (:data:`PREFILL_GRAPHS` shapes kept), a new one eagerly. Otherwise HF's own pass (as
        :meth:`ModelAdapter.prefill`) runs on a ``DynamicCache`` that is copied in.

        Args:
            input_ids: Shape ``[B, T]``, left-padded prompts.
            attention_mask: Shape ``[B, T]``, 1 for real tokens (default: all real).
            last_logits_only: return logits for the last position only (``[B, 1, V]``).

        Returns:
            ``(ForwardOutput, StaticCacheState)`` with ``Lc = T``.

        Raises:
            CapacityError: ``T + 1`` slots do not fit in ``capacity``.
        """
        B, T = input_ids.shape
        if T + 1 > self.capacity:
            raise CapacityError(f"the prompt ({T} tokens) does not fit in the static cache of {self.capacity} slots "
                                f"per row: build the adapter with a larger capacity (capacity_for(T, ...)).")
        live = self._store.live
        if live is not None and live.spent_by is None:
            live.spent_by = "prefill"  # the buffers are about to be overwritten
        if self.fused:  # the fused decoder writes the prompt's keys/values straight into the static tensors
            self._eager._check_length(T - 1)
            valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
            lengths = valid.sum(1)
            starts = T - lengths
            if attention_mask is None:
                all_valid = left_padded = True
            else:  # one host sync, once per prompt (as ModelAdapter): no padding at all? left padding only?
                left = torch.arange(T, device=valid.device) >= starts[:, None]
                all_valid, left_padded = torch.stack([valid.all(), (left == valid).all()]).tolist()
            buf = self._ensure_buffers(FusedDecoder.cache_shapes(self.model, B, self.capacity), B, input_ids.device)
            buf.starts.copy_(starts)  # read by tree attention (kv_start) while the state stays dense
            logits, feats = self._fused_prefill(buf, input_ids, valid, all_valid, last_logits_only)
            out = ForwardOutput(logits=logits, features=tuple(feats))
        else:  # HF's own pass on a DynamicCache, copied into the static tensors
            out, dyn = self._eager.prefill(input_ids, attention_mask, last_logits_only=last_logits_only)
            buf = self._ensure_buffers(self._cache_shapes(dyn.cache, B), B, input_ids.device)
            for static, layer in zip(buf.cache.layers, dyn.cache.layers):
                static.keys[:, :, :T].copy_(layer.keys)
                static.values[:, :, :T].copy_(layer.values)
            valid, lengths = dyn.committed_valid, dyn.lengths
            left_padded = False  # HF's modules read no bound: density is not tracked
        buf.valid[:, :T].copy_(valid)
        # Held buffers carry the last run's marks past T: late commits rely on every slot past a row's end being
        # invalid (a row behind the longest one would see the old run's keys), so clear them.
        buf.valid[:, T:].fill_(False)
        buf.plain.at = None  # the committed slots changed: the plain mask row is rebuilt at the next plain step
        empty = torch.empty(B, 0, dtype=torch.long, device=input_ids.device)
        return out, StaticCacheState(valid=buf.valid, committed=T, lengths=lengths, pending_parents=empty,
                                     pending_present=empty.bool(), ticket=self._issue(),
                                     dense=left_padded)

    def _fused_prefill(self, buf: _Buffers, tokens: torch.Tensor, valid: torch.Tensor, all_valid: bool,
                       last_only: bool):
        """The fused decoder's prefill; captured (a CUDA graph; eager :func:`capture_graph_ref` elsewhere) for a
        prompt shape met before, among the :data:`PREFILL_GRAPHS` most recent ones. Returns ``(logits, features)``.
        """
        fused, layers, features = self._store.fused, buf.cache.layers, self.feature_layers

        def run(tokens, valid):
            return fused.prefill(tokens, valid, layers, features, all_valid=all_valid, last_only=last_only)

        key = (*tokens.shape, all_valid, last_only)
        runner = buf.prefills.get(key)
        if runner is None:
            buf.seen[key] = buf.seen.get(key, 0) + 1
            if buf.seen[key] < 2:  # a shape met once runs eagerly
                return run(tokens, valid)
            if len(buf.prefills) >= PREFILL_GRAPHS:  # drop the oldest (its graph memory goes with it)
                buf.prefills.pop(next(iter(buf.prefills)))
            capture = capture_graph if tokens.is_cuda else functools.partial(capture_graph_ref, warmup=0)
            runner = buf.prefills[key] = _counted(capture, self._store.counts)(run, (tokens, valid))
        else:  # most recent last
            buf.prefills[key] = buf.prefills.pop(key)
        return runner(tokens, valid)

    def _issue(self) -> _Ticket:
        self._store.live = _Ticket()
        return self._store.live

    def _check_state(self, state: StaticCacheState) -> _Buffers:
        buf = self._store.buffers
        if buf is None or state.valid is not buf.valid:
            raise ValueError("this state belongs to other buffers (another adapter, or an earlier batch size): "
                             "continue from the state this adapter's prefill() returned")
        return buf

    def _check_room(self, state: StaticCacheState, size: int, num_nodes: int) -> None:
        Lc, P = state.committed, state.num_pending
        if Lc + P + size > self.capacity:
            raise CapacityError(
                f"the static cache is full: {Lc} committed + {P} pending + {size} new slots (bucket of {num_nodes} "
                f"nodes) > capacity {self.capacity}. Build the adapter with a larger capacity (generate(fast=True) "
                f"sizes it from the prompt, max_new_tokens and the largest bucket).")

    def _run_bucket(self, buf: _Buffers, state: StaticCacheState, tokens, parents, positions, present):
        """Pad the new nodes to their bucket, build the mask in place, run (or replay) the bucket's forward.

        Returns ``(ForwardOutput, all_parents)``, ``all_parents`` ``[B, P + size]`` (the pending, new and padding
        nodes' parents).
        """
        M = tokens.shape[1]
        size = bucket_for(M, self.buckets)
        self._check_room(state, size, M)
        visible = self._visible(state, size)
        (logits, feats), all_parents = self._bucket_step(
            buf, state, ("visible", size) if visible else size, size, (tokens, parents, positions, present), (),
            lambda: self._model_fn(buf, visible), self._capture_fn(), visible)
        logits, feats = logits.clone(), tuple(f.clone() for f in feats)  # the next replay overwrites them
        if size > M:
            logits, feats = logits[:, :M], tuple(f[:, :M] for f in feats)
        return ForwardOutput(logits=logits, features=tuple(feats)), all_parents

    def _visible(self, state: StaticCacheState, size: int) -> bool:
        """Whether a bucket forward of ``size`` nodes reads no mask for the committed slots (``visible_end``): a
        dense state (:attr:`StaticCacheState.dense`) on the fused decoder where it passes a bound at all."""
        fused = self._store.fused
        return state.dense and fused is not None and fused.reads_prefix_end(state.valid.shape[0], size)

    def _bucket_inputs(self, buf: _Buffers, state: StaticCacheState, tokens, parents, positions, present,
                       size: int, runner: CapturedStep | None, mark, visible: bool, device_mask: bool = False
                       ) -> tuple[tuple, torch.Tensor | None]:
        """Write a bucket forward's inputs (``runner``'s static ones, or new tensors without a runner): the tokens and
        positions (padding after them), the tree mask over the valid committed slots and the pending nodes, the
        write slots, and the bound the fused decoder reads (``buf.ends``, with ``buf.starts`` from the prefill, where
        ``visible``; else ``buf.prefix_end``). ``mark``: the key of ``buf.high_water`` of these mask columns.
        Returns ``(inputs, all_parents)``, ``all_parents`` ``[B, P + size]``.

        ``device_mask`` (no pending slots: :meth:`forward_commit`): the mask and the bound are left to the step
        itself (:func:`~specdec.kernels.tree_mask_at` from the write slots, inside the graph); the inputs then end
        with the nodes' parents and ``present`` (unless ``None``) padded to the bucket (``-1`` / ``False`` past
        ``M``), and ``all_parents`` is ``None``."""
        B, M = tokens.shape
        P, Lc = state.num_pending, state.committed
        start = Lc + P
        if runner is not None:
            tok_s, pos_s, mask_s, slot_s = runner.inputs[:4]
            node_s = runner.inputs[4:4 + _node_inputs(present)] if device_mask else ()
            # The real nodes' columns of the captured inputs, as views made once per node count.
            views = buf.consts.get(("inputs", mark, M)) or buf.consts.setdefault(
                ("inputs", mark, M), tuple(t[:, :M] for t in (tok_s, pos_s) + node_s))
        else:
            device = tokens.device
            tok_s = torch.zeros(B, size, dtype=tokens.dtype, device=device)
            pos_s = torch.zeros(B, size, dtype=torch.long, device=device)
            mask_s = torch.full((B, 1, size, self.capacity), torch.finfo(buf.dtype).min,
                                dtype=buf.dtype, device=device)
            slot_s = torch.zeros(size, dtype=torch.long, device=device)
            node_s = (torch.full((B, size), -1, dtype=torch.long, device=device),
                      torch.zeros(B, size, dtype=torch.bool, device=device))[:_node_inputs(present)] \
                if device_mask else ()
            views = tuple(t[:, :M] for t in (tok_s, pos_s) + node_s)
        for view, new in zip(views, (tokens, positions, parents, present)):
            view.copy_(new)
        if device_mask:
            self._write_slots(buf, slot_s, start, size)
            return (tok_s, pos_s, mask_s, slot_s) + node_s, None
        if size > M:  # padding nodes: absent (parent -1), each sees only itself
            pad = self._const(buf, ("pad", size - M), lambda: torch.full(
                (B, size - M), -1, dtype=parents.dtype, device=parents.device))
            all_parents = torch.cat([state.pending_parents, parents, pad], 1)
            present = torch.cat([present, self._const(buf, ("absent", size - M), lambda: pad >= 0)], 1)
        else:
            all_parents = torch.cat([state.pending_parents, parents], 1)
        end = start + size
        tree_mask(state.committed_valid, all_parents, present, buf.dtype, out=mask_s[:, :, :, :end])
        fused = self._store.fused
        if visible:
            self._late_ends(buf, state)  # each row's end (Lc for all until a late commit set them): see _model_fn
        elif fused is not None and fused.reads_prefix_end(B, size):
            buf.prefix_end.fill_(Lc)  # read by the fused decoder's tree attention only then (see _model_fn)
        # Columns past `end` must hide their (free) slots; they were written only by an earlier, wider forward.
        high = buf.high_water.get(mark, 0) if runner is not None else 0
        if high > end:
            mask_s[:, :, :, end:high].fill_(torch.finfo(buf.dtype).min)
        self._write_slots(buf, slot_s, start, size)
        return (tok_s, pos_s, mask_s, slot_s), all_parents

    def _write_slots(self, buf: _Buffers, slot_s: torch.Tensor, start: int, size: int) -> None:
        """``slot_s[:] = start .. start + size - 1``, a bucket forward's write slots."""
        if size <= buf.arange.shape[0]:
            torch.add(self._const(buf, ("arange", size), lambda: buf.arange[:size]), start, out=slot_s)
        else:
            slot_s.copy_(torch.arange(start, start + size, device=slot_s.device))

    def _run_plain(self, buf: _Buffers, state: StaticCacheState, tokens: torch.Tensor):
        """The plain step's forward (bucket 1, its own captured function): one token per row, kept at once.

        The mask row is rebuilt (:func:`~specdec.kernels.tree_mask`) only when the previous forward on these
        buffers was not a plain step at ``Lc - 1``; otherwise the captured function makes column ``Lc`` visible
        and nothing else changes. Returns ``(logits [B, 1, V], features, argmax [B])``.
        """
        B, Lc = tokens.shape[0], state.committed
        self._check_room(state, 1, 1)
        plain, dtype = buf.plain, buf.dtype
        runner = plain.runner
        if runner is None:
            device = tokens.device
            inputs = (tokens[:, None].clone(), state.lengths[:, None].clone(),
                      torch.full((B, 1, 1, self.capacity), torch.finfo(dtype).min, dtype=dtype, device=device),
                      torch.full((1,), Lc, dtype=torch.long, device=device))
            plain.at, plain.high = None, 0
        else:
            inputs = runner.inputs
            plain.tokens.copy_(tokens)
            plain.positions.copy_(state.lengths)
            inputs[3].fill_(Lc)
        if plain.at != Lc - 1:  # committed slots changed since the last plain step: the whole row again
            mask = inputs[2]
            roots = self._const(buf, ("pad", 1), lambda: torch.full((B, 1), -1, dtype=torch.long,
                                                                    device=tokens.device))
            present = self._const(buf, ("root", 1), lambda: roots < 0)
            tree_mask(state.committed_valid, roots, present, dtype, out=mask[:, :, :, :Lc + 1])
            if plain.high > Lc + 1:
                mask[:, :, :, Lc + 1:plain.high].fill_(torch.finfo(dtype).min)
        if runner is None:
            runner = plain.runner = self._capture_fn()(self._plain_fn(buf), inputs)
            plain.tokens, plain.positions = runner.inputs[0].view(B), runner.inputs[1].view(B)
        plain.at, plain.high = Lc, Lc + 1  # columns past Lc are hidden (rebuilt, or never shown)
        return _replay(runner)

    @torch.no_grad()
    def forward(self, state: StaticCacheState, tokens: torch.Tensor, parents: torch.Tensor,
                positions: torch.Tensor, present: torch.Tensor | None = None
                ) -> tuple[ForwardOutput, StaticCacheState]:
        """Run new pending nodes (padded to a bucket); each sees the valid committed slots, its ancestors and itself.

        Args:
            state: the cache state (consumed).
            tokens: Shape ``[B, M]``, the new nodes' tokens.
            parents: Shape ``[B, M]`` int64, parent of each new node as a pending index (``P`` existing pending
                slots, then these ``M``), or ``-1`` for a node on the committed prefix.
            positions: Shape ``[B, M]`` int64, position ids.
            present: Shape ``[B, M]`` bool, absent nodes see only themselves and are never kept.

        Returns:
            ``(ForwardOutput, state)``: logits ``[B, M, V]``, features ``[B, M, H]``; ``M`` more pending slots.

        Raises:
            CapacityError: the padded forward does not fit in the remaining slots.
        """
        buf = self._check_state(state)
        _consume(state, "forward")
        if present is None:
            present = torch.ones_like(tokens, dtype=torch.bool)
        state = self._tightened(state, bucket_for(tokens.shape[1], self.buckets))
        out, all_parents = self._run_bucket(buf, state, tokens, parents, positions, present)
        P, M = state.num_pending, tokens.shape[1]
        pending_present = present if not P else torch.cat([state.pending_present, present], 1)
        return out, state._replace(pending_parents=all_parents[:, :P + M], pending_present=pending_present,
                                   ticket=self._issue())

    @torch.no_grad()
    def forward_commit(self, state: StaticCacheState, tokens: torch.Tensor, parents: torch.Tensor,
                       positions: torch.Tensor, present: torch.Tensor | None, decide: Callable, extra: tuple, key
                       ) -> tuple[Any, StaticCacheState]:
        """:meth:`forward`, a caller's decision on its outputs and :meth:`commit` with ``late=True``, as one captured
        step (one graph replay on CUDA instead of a replay, the decision's launches and the commit's).

        The step builds its own tree mask from the device-side write slot (:func:`~specdec.kernels.tree_mask_at`):
        the host only copies the nodes' tokens, positions, parents (and ``present``) into the graph's inputs.
        ``decide(logits, features, tokens, positions, parents, *extra) -> (keep, counts, outputs)`` runs inside the
        capture, right after the forward, on the forward's own outputs (no copies): ``logits [B, M, V]``,
        ``features`` (one ``[B, M, H]`` per feature layer), the forward's ``tokens``, ``positions`` and ``parents``
        ``[B, M]``; it returns the pending indices each row keeps (``keep [B, A]``, ``-1`` padded), their count
        (``counts [B]``) and any tensors (``outputs``). It must be a function of its tensor arguments alone,
        without host syncs (it is replayed); ``key`` names it (one capture per bucket, node count, ``key`` and shapes
        of ``extra``). Each row's kept slots then move to the row's own end of the cache (the device-side ``Lc`` is
        the captured write slot), as :meth:`commit` with ``late=True``. The model reads the ids clamped into
        ``[0, V)`` (with a known ``vocab_size``: an id outside never reaches the embedding); ``decide`` sees them as
        given, to flag them.

        The returned ``outputs`` are the captured step's own tensors: valid until the next call of this method
        (clone what must live longer). Past the largest bucket the same function runs eagerly.

        Args:
            state: a state with no pending slots (consumed).
            tokens: Shape ``[B, M]``, the new nodes' tokens (``M`` = root + drafts).
            parents: Shape ``[B, M]`` int64, parent of each node (``-1``: on the committed prefix), as
                :meth:`forward`'s.
            positions: Shape ``[B, M]`` int64, position ids.
            present: Shape ``[B, M]`` bool, absent nodes see only themselves; ``None``: node 0 (the root) and every
                node with a parent are present, the others absent (the tree convention of
                :func:`specdec.step.step`), found inside the step.
            decide: see above.
            extra: tensors passed to ``decide`` after ``parents`` (copied into the captured step's inputs).
            key: hashable, names ``decide``'s computation.

        Returns:
            ``(outputs, state)``: ``decide``'s outputs and the state after the late commit (``Lc + A``
            committed slots at most, each row's count added to ``lengths``).

        Raises:
            ValueError: ``state`` has pending slots.
            CapacityError: as :meth:`forward`.
        """
        if state.num_pending:
            raise ValueError(f"forward_commit() needs a state with no pending slots, this one has "
                             f"{state.num_pending}: commit() the pending tree first")
        buf = self._check_state(state)
        _consume(state, "forward")
        M = tokens.shape[1]
        size = bucket_for(M, self.buckets)
        state = self._tightened(state, size)
        self._check_room(state, size, M)
        self._late_ends(buf, state)  # the captured step moves each row's path to its end
        visible = self._visible(state, size)
        (outputs, keep, counts), _ = self._bucket_step(
            buf, state, ("commit", size, M, key, _spec(extra), visible, present is None), size,
            (tokens, parents, positions, present), extra, lambda: self._commit_fn(buf, size, M, decide, visible,
                                                                                  present is None),
            lambda step, inputs: self._capture_committing(buf, step, inputs), visible, device_mask=True)
        return outputs, self._late_committed(buf, state, keep.shape[1], counts)

    @torch.no_grad()
    def forward_chain(self, state: StaticCacheState, tokens: torch.Tensor, parents: torch.Tensor,
                      positions: torch.Tensor, present: torch.Tensor, root_index: torch.Tensor, num_levels: int,
                      vocab_size: int | None = None) -> tuple[torch.Tensor, StaticCacheState]:
        """:meth:`forward` of ``tokens``, then a greedy chain of ``num_levels - 1`` one-token forwards, as one
        captured step (one graph replay on CUDA instead of ``num_levels`` replays and the ops between them).

        The chain starts at each row's node ``root_index`` of ``tokens``: level 1 is the argmax of the root's
        logits; level ``j + 1`` the argmax of the logits of level ``j``'s token, run at position
        ``positions[b, root_index[b]] + j`` and seeing what the root sees plus levels ``1..j``. It is how a draft
        model drafts a chain of ``K = num_levels`` tokens greedily (:class:`~specdec.drafters.DraftModelDrafter`):
        the same forwards and argmaxes as :meth:`forward` level by level, without the host between them.

        Args:
            state: the cache state (consumed).
            tokens: Shape ``[B, M]``, the first forward's nodes (e.g. committed tokens the draft model has not run,
                ending in the root).
            parents: Shape ``[B, M]`` int64, as :meth:`forward`'s.
            positions: Shape ``[B, M]`` int64, position ids.
            present: Shape ``[B, M]`` bool, as :meth:`forward`'s.
            root_index: Shape ``[B]`` int64, the chain's root among the ``M`` nodes (present).
            num_levels: ``K >= 1``, tokens drafted (``K - 1`` one-token forwards after the first).
            vocab_size: take the argmax over the first ``vocab_size`` logits only (a draft model whose embedding is
                padded past the target's vocabulary); ``None``: all.

        Returns:
            ``(drafts [B, K] int64, state)``: ``M + K - 1`` more pending slots: the ``M`` nodes, then levels
            ``1..K - 1`` (level ``j``'s parent: the root for ``j = 1``, level ``j - 1`` after); level ``K`` is
            not run.

        Raises:
            ValueError: ``num_levels < 1``.
            CapacityError: the forwards do not fit in the remaining slots.
        """
        if num_levels < 1:
            raise ValueError(f"forward_chain: num_levels must be >= 1, got {num_levels}")
        buf = self._check_state(state)
        _consume(state, "forward")
        B, M = tokens.shape
        size = bucket_for(M, self.buckets)
        state = self._tightened(state, max(size, M + num_levels - 1))
        self._check_room(state, max(size, M + num_levels - 1), M)
        P = state.num_pending
        root_index = root_index.long()
        capture = self._capture_fn()
        visible = self._visible(state, size)
        drafts, all_parents = self._bucket_step(
            buf, state, ("chain", size, M, num_levels, vocab_size, visible), size,
            (tokens, parents, positions, present), (root_index, positions.gather(1, root_index[:, None])[:, 0]),
            lambda: self._chain_fn(buf, M, num_levels, vocab_size, visible),
            getattr(capture, "capture", capture), visible)  # under compile, _chain_fn compiled the forwards
        drafts = drafts.clone()  # the captured step's own tensor: the next replay overwrites it
        if num_levels > 1:  # level 1 hangs from the root, each next level from the one before
            level_parents = torch.cat([(P + root_index)[:, None], P + M + torch.arange(
                num_levels - 2, device=tokens.device).expand(B, -1)], 1)
        else:
            level_parents = all_parents.new_empty(B, 0)
        pending_present = torch.cat([*([state.pending_present] if P else []), present,
                                     torch.ones(B, num_levels - 1, dtype=torch.bool, device=tokens.device)], 1)
        return drafts, state._replace(pending_parents=torch.cat([all_parents[:, :P + M], level_parents], 1),
                                      pending_present=pending_present, ticket=self._issue())

    def _bucket_step(self, buf: _Buffers, state: StaticCacheState, graph_key, size: int, nodes: tuple, extra: tuple,
                     make_step: Callable[[], Callable], capture: Callable[..., CapturedStep], visible: bool,
                     device_mask: bool = False):
        """Write a bucket forward's inputs for ``nodes`` (``tokens, parents, positions, present``), then run the
        step captured under ``graph_key`` on them and ``extra`` (``make_step()`` captured by ``capture`` at its
        first call; run eagerly past the largest bucket); ``visible``: its forward reads the rows' ends (see
        :meth:`_model_fn`), a key of its own; ``device_mask``: the step builds its own mask (see
        :meth:`_bucket_inputs`). Returns ``(the step's outputs, all_parents)``."""
        runner = buf.runners.get(graph_key) if size <= self.buckets[-1] else None
        inputs, all_parents = self._bucket_inputs(buf, state, *nodes, size, runner, graph_key, visible, device_mask)
        if runner is not None:
            copy_changed(runner.inputs[len(inputs):], extra, buf.consts.setdefault(("copied", graph_key), {}))
            out = runner._run()
        elif size > self.buckets[-1]:
            out = make_step()(*inputs, *extra)
        else:
            runner = buf.runners[graph_key] = capture(make_step(), (*inputs, *extra))
            out = runner._run()
        buf.high_water[graph_key] = state.committed + state.num_pending + size
        return out, all_parents

    def _chain_fn(self, buf: _Buffers, M: int, num_levels: int, vocab: int | None, visible: bool) -> Callable:
        """The function :meth:`forward_chain` captures: the bucket forward, then the greedy one-token levels."""
        model = self._model_fn(buf, visible)
        compile_fn = getattr(self._capture_fn(), "compile_fn", None)
        if compile_fn is not None:
            model = compile_fn(model)

        def argmax(logits: torch.Tensor) -> torch.Tensor:
            return (logits if vocab is None else logits[..., :vocab]).argmax(-1)

        def run(tokens, positions, mask, slots, root_index, root_positions):
            logits, _ = model(tokens, positions, mask, slots)
            B, V = logits.shape[0], logits.shape[-1]
            token = argmax(logits.gather(1, root_index[:, None, None].expand(B, 1, V))[:, 0])
            drafts = [token]
            # the root's mask row: committed slots, its pending ancestors and itself; each level adds its own slot
            row = mask.gather(2, root_index[:, None, None, None].expand(B, 1, 1, mask.shape[-1]))
            for j in range(1, num_levels):
                slot = slots[:1] + (M + j - 1)
                row.index_fill_(-1, slot, 0.0)
                logits, _ = model(token[:, None], (root_positions + j)[:, None], row, slot)
                token = argmax(logits[:, 0])
                drafts.append(token)
            return torch.stack(drafts, 1)
        return run

    def _commit_fn(self, buf: _Buffers, size: int, M: int, decide: Callable, visible: bool,
                   root_present: bool = False) -> Callable:
        """The function :meth:`forward_commit` captures: the tree mask (:func:`~specdec.kernels.tree_mask_at`, from
        the device-side write slot), forward, ``decide``, then the moves to the rows' ends. ``root_present``: no
        ``present`` input; node 0 and the nodes with a parent are present."""
        model = self._model_fn(buf, visible)
        compile_fn = getattr(self._capture_fn(), "compile_fn", None)
        if compile_fn is not None:  # compile the forward alone: the kernels after it run as they are
            model = compile_fn(model)
        valid, ends, plan, vocab = buf.valid, buf.ends, buf.compact, self.vocab_size
        fused = self._store.fused
        prefix_end = not visible and fused is not None and fused.reads_prefix_end(valid.shape[0], size)
        # the ids clamped into [0, V) before the embedding; the fused decoder's own gather clamps into its table
        clamp = vocab is not None and not (fused is not None and fused.clamps_ids(vocab))

        def run(tokens, positions, mask, slots, parents, *extra):
            # root_present: the mask kernel finds the present nodes from the parents itself (present=None)
            present, extra = (None, extra) if root_present else (extra[0], extra[1:])
            # The mask from the device-side write slot (Lc = slots[0]): built inside the graph, nothing on the host.
            tree_mask_at(valid, parents, present, slots[:1], mask)
            if prefix_end:  # the committed slots' count the fused decoder's tree attention reads (see _model_fn)
                buf.prefix_end.copy_(slots[:1])
            logits, feats = model(tokens if not clamp else tokens.clamp(0, vocab - 1), positions, mask, slots)
            if size > M:
                logits, feats = logits[:, :M], tuple(f[:, :M] for f in feats)
            keep, counts, outputs = decide(logits, tuple(feats), tokens[:, :M], positions[:, :M], parents[:, :M],
                                           *extra)
            plan.move_to_ends(keep, slots[:1], ends)  # no pending slots before: the first write slot is Lc
            kept_at_ends(valid, ends, counts, keep.shape[1])
            return outputs, keep, counts
        return run

    def _capture_committing(self, buf: _Buffers, step: Callable, inputs: tuple) -> CapturedStep:
        """Capture ``step`` (which moves cache entries and updates ``valid`` / ``ends`` in place): the capture's
        eager warm-up runs leave ``valid`` and ``ends`` as they found them (their cache writes land on slots the
        replay rewrites or that ``valid`` hides)."""
        capture = self._capture_fn()
        capture = getattr(capture, "capture", capture)  # the forward inside is compiled by _commit_fn
        state, capturing = (buf.valid, buf.ends), [True]

        def run(*args):
            if not capturing[0] or (args[0].is_cuda and torch.cuda.is_current_stream_capturing()):
                return step(*args)
            saved = [t.clone() for t in state]
            out = step(*args)
            for t, s in zip(state, saved):
                t.copy_(s)
            return out
        runner = capture(run, inputs)
        capturing[0] = False
        return runner

    @torch.no_grad()
    def decode(self, state: StaticCacheState, tokens: torch.Tensor) -> tuple[ForwardOutput, StaticCacheState]:
        """Run one token per row and keep it (the bucket-1 forward; nothing to compact).

        Args:
            state: a state with no pending slots (consumed).
            tokens: Shape ``[B]`` int64, each row's next token (the root).

        Returns:
            ``(ForwardOutput, state)``: logits ``[B, 1, V]``, features ``[B, 1, H]``; one more committed slot.
        """
        if state.num_pending:
            raise ValueError(f"decode() needs a state with no pending slots, this one has {state.num_pending}: "
                             f"commit() the pending tree first")
        out, state, _ = self.decode_argmax(state, tokens)
        return out, state

    @torch.no_grad()
    def decode_argmax(self, state: StaticCacheState, tokens: torch.Tensor
                      ) -> tuple[ForwardOutput, StaticCacheState, torch.Tensor]:
        """:meth:`decode`, plus each row's argmax next token, computed inside the captured forward.

        Math: ``argmax_v logits[b, 0, v]`` (ties to the lowest id), the very op
        :func:`specdec.sampling.next_token` runs when greedy, on the same logits.

        Args:
            state: a state with no pending slots (consumed).
            tokens: Shape ``[B]`` int64, each row's next token (the root).

        Returns:
            ``(ForwardOutput, state, next_tokens)``: as :meth:`decode`; ``next_tokens`` Shape ``[B]`` int64.
        """
        if state.num_pending:
            raise ValueError(f"decode() needs a state with no pending slots, this one has {state.num_pending}: "
                             f"commit() the pending tree first")
        buf = self._check_state(state)
        _consume(state, "decode")
        state = self._tightened(state, 1)
        Lc = state.committed
        if 1 in self.buckets:
            logits, feats, next_tokens = self._run_plain(buf, state, tokens)
            out = ForwardOutput(logits=logits, features=tuple(feats))
        else:  # no bucket of its own: padded like a tree forward
            B = tokens.shape[0]
            root = torch.full((B, 1), -1, dtype=torch.long, device=tokens.device)
            out, _ = self._run_bucket(buf, state, tokens[:, None], root, state.lengths[:, None], root < 0)
            buf.valid[:, Lc] = True
            next_tokens = out.logits[:, -1].argmax(-1)
        # Every row now ends at Lc + 1 (a row that ended earlier keeps a hole, hidden by `valid`: no longer dense).
        return out, state._replace(committed=Lc + 1, lengths=state.lengths + 1, ticket=self._issue(), ends=None,
                                   mark=None, dense=state.dense and state.ends is None), next_tokens

    @staticmethod
    def _tightened(state: StaticCacheState, size: int) -> StaticCacheState:
        """``state`` with ``Lc`` lowered from its mark once the copy of the ends has arrived
        (:func:`~specdec.graphs.settle_bound`: the longest row then plus what ``Lc`` grew by since); no host sync,
        unless the bucket would not fit under the bound: then the rows' true ends are read (one sync), since a
        settled old mark is still loose by every commit's width since it was taken."""
        if (state.mark is None and state.ends is None) or state.num_pending:
            return state  # nothing to lower, or pending slots already written after Lc: it must stay put
        if state.committed + size > state.valid.shape[1] and state.ends is not None:
            return state._replace(committed=min(state.committed, int(state.ends.max())), mark=None)
        committed, mark = settle_bound(state.committed, state.mark)
        return state._replace(committed=committed, mark=mark)

    #: :meth:`commit` takes ``late=True`` (:func:`specdec.step.step` with ``sync=False`` then commits without a
    #: host sync).
    commits_late = True

    @torch.no_grad()
    def commit(self, state: StaticCacheState, keep: torch.Tensor, counts: torch.Tensor, *,
               prefix: bool | None = None, full: bool | None = None, late: bool = False) -> StaticCacheState:
        """Keep, per row, a path of pending slots as committed tokens, moved in place inside the static tensors.

        Args:
            state: a state with ``P`` pending slots (consumed).
            keep: Shape ``[B, A]`` int64, pending indices to keep, in sequence order, ``-1`` padded.
            counts: Shape ``[B]`` int64, real entries of ``keep`` per row.
            prefix: whether every row keeps a prefix of its pending slots (nothing moves), if the caller knows;
                ``None``: found out with one host sync.
            full: accepted for :class:`~specdec.adapter.ModelAdapter` compatibility (holes are masked through
                ``valid`` either way).
            late: the caller knows only ``A`` (the path's width), not the counts: each row's kept slots move to the
                row's own end (``ends``, on the device) instead of the shared ``Lc``, so rows stay dense and nothing
                needs the counts on the host. ``Lc`` grows by ``A`` as an upper bound; a later forward lowers it
                again from the ends' copy to the host (:attr:`StaticCacheState.mark`).

        Returns:
            The state with no pending slots and ``Lc + A`` committed slots (with ``late``: at most).
        """
        buf = self._check_state(state)
        _consume(state, "commit")
        A = keep.shape[1]
        Lc, P = state.committed, state.num_pending
        if A > P:
            raise ValueError(f"commit() keeps {A} slots per row but only {P} are pending: keep at most the pending "
                             f"slots (VerifyResult.accepted_nodes cut to the widest count)")
        if late:
            return self._commit_late(buf, state, keep, counts)
        if A:
            buf.compact(keep, counts, Lc, prefix=prefix)  # in place: the captured graphs read these very tensors
            if A <= buf.arange.shape[0]:
                columns = self._const(buf, ("columns", A), lambda: buf.arange[None, :A])
            else:
                columns = torch.arange(A, device=keep.device)[None, :]
            torch.lt(columns, counts[:, None], out=buf.valid[:, Lc:Lc + A])
            buf.plain.at = None  # new committed slots (holes included): the plain mask row is rebuilt
            state = state._replace(dense=False)  # a row keeping fewer than A slots has a hole before Lc + A
        return self._committed(buf, state, A, counts, ends=None, mark=None)

    def _commit_late(self, buf: _Buffers, state: StaticCacheState, keep: torch.Tensor,
                     counts: torch.Tensor) -> StaticCacheState:
        """:meth:`commit` with ``late=True``: per-row destinations, no host sync."""
        A = keep.shape[1]
        ends = self._late_ends(buf, state)
        if A:
            buf.compact(keep, counts, state.committed, dest=ends)
            kept_at_ends(buf.valid, ends, counts, A)
        return self._late_committed(buf, state, A, counts)

    @staticmethod
    def _late_ends(buf: _Buffers, state: StaticCacheState) -> torch.Tensor:
        """``buf.ends`` for a late commit: every row ends at ``Lc`` unless an earlier late commit set them."""
        if state.ends is None:
            buf.ends.fill_(state.committed)
        return buf.ends

    def _late_committed(self, buf: _Buffers, state: StaticCacheState, A: int, counts: torch.Tensor
                        ) -> StaticCacheState:
        """The state after a late commit of width ``A`` (the moves and ``valid`` / ``ends`` already done)."""
        if A:
            buf.plain.at = None  # new committed slots: the plain mask row is rebuilt
        # The ends on their way to the host (unless a copy still is), for a later forward to lower Lc: no sync now.
        mark = state.mark if state.mark is not None else mark_bound(buf.ends, state.committed + A)
        return self._committed(buf, state, A, counts, ends=buf.ends, mark=mark)

    def _committed(self, buf: _Buffers, state: StaticCacheState, A: int, counts: torch.Tensor, *, ends, mark
                   ) -> StaticCacheState:
        """The state after a commit of width ``A``: ``Lc + A`` committed slots, nothing pending, a new ticket."""
        B, device = counts.shape[0], counts.device
        empty = self._const(buf, ("empty", torch.long), lambda: torch.empty(B, 0, dtype=torch.long, device=device))
        empty_bool = self._const(buf, ("empty", torch.bool), lambda: empty.bool())
        return state._replace(committed=state.committed + A, lengths=state.lengths + counts, pending_parents=empty,
                              pending_present=empty_bool, ticket=self._issue(), ends=ends, mark=mark)


def _node_inputs(present: torch.Tensor | None) -> int:
    """How many per-node inputs past the write slots a :meth:`StaticAdapter.forward_commit` step takes: the parents,
    and ``present`` unless the step finds it from the parents."""
    return 1 if present is None else 2


def _param_ids(model: nn.Module) -> tuple:
    """Each parameter's id, storage address and dtype: a parameter replaced by another tensor, or moved / cast
    (``model.to(...)`` swaps ``.data``), changes them, and graphs captured on the old memory must not replay."""
    return tuple((id(p), p.data_ptr(), p.dtype) for p in model.parameters())


def _replay(runner: CapturedStep):
    """Run a captured step on its static inputs, already filled in place (no copies in), and clone its outputs
    (the next replay overwrites them), as :meth:`~specdec.graphs.CapturedStep.__call__` does."""
    return tuple(tuple(t.clone() for t in out) if isinstance(out, (tuple, list)) else out.clone()
                 for out in runner._run())


# ---------------------------------------------------------------------- choosing the adapter in generate()

_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def target_adapter(model: nn.Module, feature_layers: tuple[int, ...], *, fast: bool | str, prompt_len: int,
                   max_new_tokens: int, buckets: Sequence[int] = DEFAULT_BUCKETS, min_len: int = 0):
    """The target adapter ``generate()`` uses: :class:`StaticAdapter` when ``fast`` and the model supports it.

    With ``fast=True`` and a model :func:`static_support` refuses, warns once (naming why) and returns the eager
    :class:`~specdec.adapter.ModelAdapter`: never a wrong result. On CUDA the static buffers and the graphs
    captured on them are kept per model (weakly: they do not keep the model alive) and feature layers, and reused
    by later calls with the same batch size whose sequences fit their capacity; elsewhere nothing is kept.

    Args:
        model: the target, an HF causal LM.
        feature_layers: HF ``hidden_states`` indices the drafter reads.
        fast: ``False`` (eager), ``True`` (the static path, graphs on CUDA) or ``"compile"`` (the static path,
            each bucket's forward compiled with ``torch.compile`` before its capture: :func:`compiled_capture`).
        prompt_len: ``T``, the padded prompt length.
        max_new_tokens: new tokens per row.
        buckets: padded forward sizes.
        min_len: size the cache for sequences (prompt + new tokens) of at least this length
            (``generate(max_cache_len=)``).

    Returns:
        A :class:`StaticAdapter` or a :class:`~specdec.adapter.ModelAdapter`. Its capacity is
        :func:`capacity_for` aligned to 64 slots, or to :data:`COMPILE_CAPACITY_MULTIPLE` under ``"compile"`` (a
        larger cache recompiles every compiled step), and at least the held buffers' on CUDA.
    """
    mode = fast_mode(fast)
    if mode is None:
        return ModelAdapter(model, feature_layers)
    reason = static_support(model)
    if reason is not None:
        warnings.warn(f"generate(fast=True): {type(model).__name__} falls back to the eager path: {reason}.",
                      stacklevel=3)
        return ModelAdapter(model, feature_layers)
    # compiled steps are recompiled (tens of seconds) for every new cache size, captured ones only re-captured
    # (milliseconds): under "compile" the cache takes 256-slot steps, so longer prompts mostly fit the held one
    capacity = capacity_for(max(prompt_len + max_new_tokens, min_len), 0, max(buckets),
                            multiple=COMPILE_CAPACITY_MULTIPLE if mode == "compile" else 64)
    if not next(model.parameters()).is_cuda:
        return StaticAdapter(model, feature_layers, capacity=capacity, buckets=buckets)
    key = (tuple(feature_layers), tuple(sorted(set(buckets))), mode)
    store = _STORES.setdefault(model, {}).setdefault(key, _Store())
    if store.buffers is not None:  # keep the held buffers (and graphs) when the run fits in them
        capacity = max(capacity, store.buffers.valid.shape[1])
    adapter = StaticAdapter(model, feature_layers, capacity=capacity, buckets=buckets,
                            capture=compiled_capture() if mode == "compile" else None)
    adapter._store = store
    return adapter


def held_graphs(model: nn.Module) -> dict[tuple, dict[str, int]]:
    """What the fast path holds for ``model`` between ``generate()`` calls (CUDA; elsewhere nothing is kept).

    One entry per set of held buffers, keyed ``(feature_layers, buckets, mode)`` as :func:`target_adapter` keeps
    them (drafters reading the same target layers share one): ``builds`` and ``captures`` so far (see
    :attr:`StaticAdapter.counts`), then what is held now: ``batch`` and ``capacity`` of the buffers, ``graphs``
    (captured bucket steps, the plain step, prefills). A benchmark reads it before and after a timed call: a
    capture or a build inside the timing is a cost a longer run would not pay per call.

    Args:
        model: the target given to :func:`specdec.generate`.

    Returns:
        ``{(feature_layers, buckets, mode): {"builds", "captures", "batch", "capacity", "graphs"}}``; empty for a
        model the fast path has not run on CUDA.
    """
    out = {}
    for key, store in _STORES.get(model, {}).items():
        buf = store.buffers
        held = dict(batch=0, capacity=0, graphs=0) if buf is None else dict(
            batch=buf.valid.shape[0], capacity=buf.valid.shape[1],
            graphs=len(buf.runners) + len(buf.prefills) + (buf.plain.runner is not None))
        out[key] = {**store.counts, **held}
    return out


def release_graphs(*objects) -> int:
    """Let go of what the fast path keeps between ``generate()`` calls for each target model or drafter given: a
    model's static buffers and captured graphs (:func:`held_graphs`; a verify graph with a drafter's update folded in
    also holds the tensors that drafter's step read), a drafter's graphed wrappers (:func:`graphed_wrappers`).
    The next fast call builds and captures anew. Use it in a long session that tries many drafters on one target.

    Args:
        *objects: target models and drafters (anything else is ignored).

    Returns:
        How many held stores and wrappers were let go.
    """
    released = 0
    for obj in objects:
        try:
            released += len(_STORES.pop(obj, {}))
        except TypeError:  # not weak-referenceable: nothing kept for it
            pass
        held = _wrappers_of(obj, create=False)
        if held is not None:
            released += len(held)
            held.clear()
    return released


def fast_mode(fast) -> str | None:
    """``generate()``'s ``fast`` argument as ``None`` (eager), ``"graphs"`` or ``"compile"``.

    Args:
        fast: ``False``, ``True`` (= ``"graphs"``), ``"graphs"`` or ``"compile"``.

    Raises:
        ValueError: any other value (names the accepted ones).
    """
    if fast is False or fast is None:
        return None
    if fast is True or fast == "graphs":
        return "graphs"
    if fast == "compile":
        return "compile"
    raise ValueError(f"fast must be one of False, True (= 'graphs') or 'compile', got {fast!r}")


def fast_drafter(drafter, mode: str = "graphs"):
    """``drafter`` wrapped by :func:`specdec.graphs.cuda_graphed` when it is graphable and not wrapped yet (with
    ``mode="compile"``, a drafter wrapped with the default capture is wrapped again, compiled, keeping its
    ``prefetch``).

    The wrapper is kept per drafter and mode, so graphs captured in one ``generate()`` call replay in the next: on the
    drafter itself (a reference cycle the garbage collector frees with the drafter; copies and pickles of the drafter
    start without), never in a table that would keep every drafter alive; a frozen dataclass drafter (a
    configuration) shares it with equal ones, the last :data:`SHARED_DRAFTERS` configurations kept. A drafter with
    a ``for_fast_path()`` method is graphed as the drafter that method returns (same tokens, a form that captures: a
    prompt lookup's fixed-width search).

    Args:
        drafter: a :class:`~specdec.drafters.Drafter` or ``None``.
        mode: ``"graphs"``, or ``"compile"``: each captured step is compiled first (:func:`compiled_capture`).

    Returns:
        The drafter to use.
    """
    from .graphs import GraphableDrafter, GraphedDrafter

    prefetch = False
    if isinstance(drafter, GraphedDrafter):  # e.g. from a recipe: kept, unless it should compile and does not
        if mode != "compile" or drafter.capture is not capture_graph:
            return drafter
        drafter, prefetch = drafter.drafter, drafter.prefetch
    if drafter is None or not isinstance(drafter, GraphableDrafter):
        return drafter

    def wrap():
        variant = getattr(drafter, "for_fast_path", None)
        inner = variant() if variant is not None else drafter
        if mode == "compile":
            return GraphedDrafter(inner, capture=compiled_capture(), prefetch=prefetch)
        return GraphedDrafter(inner)
    wrappers = _wrappers_of(drafter, create=True)
    if wrappers is None:  # no attributes (__slots__) and no value to share by: a new wrapper per call
        return wrap()
    key = (mode, prefetch)
    if key not in wrappers:
        wrappers[key] = wrap()
    return wrappers[key]


SHARED_DRAFTERS = 8
"""How many value-equal drafter configurations (frozen dataclasses such as ``PromptLookupDrafter``) keep a shared
wrapper (:func:`fast_drafter`), least recently used dropped first."""

_SHARED: collections.OrderedDict = collections.OrderedDict()


def _wrappers_of(drafter, create: bool):
    """Where :func:`fast_drafter` keeps ``drafter``'s wrappers: for a frozen dataclass drafter (a configuration: equal
    ones draft alike, so ``generate(drafter=PromptLookupDrafter(...), fast=True)`` written inline replays the last
    call's graphs), a table shared by equal drafters, bounded by :data:`SHARED_DRAFTERS`; otherwise the drafter's own
    attributes. ``None``: nowhere (or nothing yet, with ``create=False``)."""
    if dataclasses.is_dataclass(drafter) and type(drafter).__dataclass_params__.frozen:
        try:
            held = _SHARED.get(drafter)
            if held is None and create:
                held = _SHARED[drafter] = _Wrappers()
                while len(_SHARED) > SHARED_DRAFTERS:
                    _SHARED.popitem(last=False)
            elif held is not None and create:  # a use, not a look (graphed_wrappers, release_graphs)
                _SHARED.move_to_end(drafter)
            return held
        except (TypeError, RuntimeError):  # a field without a hash or a plain equality (a tensor): by attributes
            pass
    attributes = getattr(drafter, "__dict__", None)
    if attributes is None:
        return None
    held = attributes.get(_WRAPPERS)
    if isinstance(held, _Wrappers) and held.owner is drafter:  # not a shallow copy's original's
        return held
    if not create:
        return None
    held = attributes[_WRAPPERS] = _Wrappers(drafter)
    return held


def graphed_wrappers(drafter) -> list:
    """The graphed wrappers :func:`fast_drafter` keeps on ``drafter`` (one per mode; empty if none was made), e.g.
    to read their ``counts`` (a benchmark checks that a timed call captured nothing).

    Args:
        drafter: a drafter given to ``generate(fast=...)``, or anything.

    Returns:
        A list of :class:`~specdec.graphs.GraphedDrafter`.
    """
    held = _wrappers_of(drafter, create=False)
    return list(held.values()) if held is not None else []


_WRAPPERS = "_specdec_fast_wrappers"


class _Wrappers(dict):
    """A drafter's graphed wrappers by ``(mode, prefetch)`` (:func:`fast_drafter`), with the drafter they belong to
    (``owner``): a shallow copy of the drafter shares this dict and gets its own; deep copies and pickles start
    empty (the CUDA graphs belong to the drafter they were captured on)."""

    def __init__(self, owner=None):
        super().__init__()
        self.owner = owner

    def __deepcopy__(self, memo) -> _Wrappers:
        return _Wrappers()

    def __reduce__(self):
        return _Wrappers, ()
