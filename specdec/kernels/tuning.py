"""Choosing a verify forward's linear kernel by timing the candidates once, on the card they will run on.

A tree's verify forward multiplies a few dozen rows (61 at batch 1 for EAGLE-2's 60-node tree) by every weight of
the target. Which kernel streams those weights fastest depends on the card: on the H200 (sessions 26-27,
``docs/results/fast_s26``) cuBLASLt's picks beat :func:`specdec.kernels.linear_skinny` at 61-64 rows, while on an
H100 (session 39, ``docs/results/fast_s39``) the skinny kernel with five loads in flight reads Llama-2-7B's
``[gate; up]`` at 2.74 TB/s against cuBLASLt's 2.52, and with the choice below the fast 7B EAGLE-2 step took 7.35 / 7.37
instead of 7.72 / 7.83 ms (alternating processes).
No fixed rule fits both, so :func:`tuned_linear_config` times them on the weights themselves (all the layers'
matrices of one projection in turn: the order and the cache misses of a real forward) and keeps the winner per
``(card, dtype, rows, N, K, BLAS library)`` for the process. Each product is timed after a launch of the fused
norm kernel, as a forward runs it between the fused element-wise ops: the library's Triton kernels start early
under programmatic dependent launch (PDL) and a BLAS kernel ends that chain on both sides, which a chain of products
alone does not show (session 42, an H100: with the ``[q; k; v]`` and ``o_proj`` products off cuBLASLt the 7B
EAGLE-2 step took 7.23 / 7.24 instead of 7.28 / 7.29 ms, alternating processes).

The choice is a speed choice only: both compute ``F.linear`` (float32 accumulation; the summation order differs,
so bfloat16 results can differ in the last bit between the two). The BLAS call stays unless a skinny launch beats
it by more than :data:`TUNE_MARGIN`, so close cases do not flip between processes.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..bench import no_gc
from ._triton import triton
from .decoder_ops import add_rms_norm
from .skinny import SKINNY_DTYPES, SKINNY_MAX_ROWS, SKINNY_MIN_ROWS, SkinnyConfig, linear_skinny, skinny_config

__all__ = ["TUNE_MARGIN", "SKINNY_TUNE_CONFIGS", "tuned_linear_config", "pick_fastest", "clear_linear_picks",
           "linear_picks", "captured_time_us"]

#: A skinny launch replaces the BLAS call only when it is this much faster (a fraction of the BLAS call's time).
TUNE_MARGIN = 0.02

#: The skinny launches timed besides :func:`~specdec.kernels.skinny.skinny_config`'s default
#: (``(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages)``): the best of session 39's sweep on an H100 for the
#: Llama-2-7B verify's matrices at 64 rows (``[gate; up]``, ``o_proj``: 64 x 128, five stages; ``down_proj``: the
#: same with ``K`` split in two; ``[q; k; v]`` and the ``lm_head``: 128 x 128, 8 warps, three stages).
SKINNY_TUNE_CONFIGS = (SkinnyConfig(64, 128, 1, 4, 5), SkinnyConfig(64, 128, 2, 4, 5), SkinnyConfig(128, 128, 1, 8, 3))

# a launch the card cannot hold (its shared memory) is no candidate
_LAUNCH_ERRORS = (triton.runtime.errors.OutOfResources,) if triton is not None else ()

_PICKS: dict = {}  # (card, dtype, rows, n, k, blas) -> SkinnyConfig, or None for F.linear


def linear_picks() -> dict:
    """The choices made so far in this process: ``{(card, dtype, rows, N, K, blas): SkinnyConfig or None}``
    (``None``: ``F.linear``). A copy."""
    return dict(_PICKS)


def clear_linear_picks() -> None:
    """Forget every choice (the next forward that needs one times the candidates again)."""
    _PICKS.clear()


def pick_fastest(times: dict, default, margin: float = TUNE_MARGIN):
    """The key of the fastest entry of ``times``, or ``default`` unless that entry is faster than ``default``'s by
    more than ``margin`` of ``default``'s time.

    Args:
        times: ``{candidate: seconds or microseconds}`` (one unit throughout); ``default`` must be a key.
        default: the candidate kept when no other is clearly faster.
        margin: the fraction of ``default``'s time another candidate must save.

    Returns:
        A key of ``times``.

    Raises:
        ValueError: ``default`` not timed, or a negative ``margin``.

    Example:
        >>> pick_fastest({"blas": 10.0, "a": 9.9, "b": 9.0}, "blas")
        'b'
        >>> pick_fastest({"blas": 10.0, "a": 9.9}, "blas")
        'blas'
    """
    if default not in times:
        raise ValueError(f"pick_fastest: the default {default!r} has no time; time it with the others")
    if margin < 0:
        raise ValueError(f"pick_fastest: margin must be >= 0, got {margin}")
    best = min(times, key=times.get)
    return best if times[best] < times[default] * (1.0 - margin) else default


def captured_time_us(fn: Callable[[], object], reps: int = 3, *, replays: int = 1) -> float:
    """GPU time of ``fn`` as a captured step runs it: ``fn`` called once eagerly (compiles, warms), captured as a
    CUDA graph, then the fastest of ``reps`` timings of ``replays`` back-to-back replays, per replay, in
    microseconds (CUDA events). Captured because launched eagerly, the Triton launches' host time (tens of
    microseconds each in Python) would count against the kernels (session 39: the eager timing kept cuBLASLt for
    the 7B ``[gate; up]`` that a graph runs 8% faster on the skinny kernel).

    Args:
        fn: CUDA work to time, capturable (no host syncs, no new allocations' contents read on the host).
        reps: timings; the fastest counts.
        replays: graph replays per timing.

    Returns:
        Microseconds per replay.
    """
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with no_gc(), torch.cuda.graph(graph):  # no dead graph freed under the capture (specdec.graphs.capture_graph)
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(reps):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / replays)
    del graph
    return best


def tuned_linear_config(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None], rows: int, *,
                        reps: int = 3, timer: Callable[[Callable[[], object], int], float] | None = None
                        ) -> SkinnyConfig | None:
    """How to multiply ``rows`` rows by these weights fastest on their card: ``None`` for ``F.linear`` (the BLAS
    library torch prefers now), else the :class:`~specdec.kernels.skinny.SkinnyConfig` to run
    :func:`~specdec.kernels.linear_skinny` with. Timed once per ``(card, dtype, rows, N, K, BLAS library)`` and
    process, over all of ``weights`` in turn (one layer's matrix after another, as a forward reads them, each
    product after a launch of :func:`~specdec.kernels.add_rms_norm`, as between a forward's fused ops); later
    calls return the kept choice. Never timed on CPU, for float32 or rows outside the skinny kernel's range, inside
    a CUDA graph capture or under ``torch.compile``: ``None`` there (and nothing kept while capturing).

    Args:
        weights: Shape ``[N, K]`` each, one dtype and device (e.g. every layer's ``[gate; up]``).
        biases: one per weight, Shape ``[N]`` or ``None``.
        rows: the rows of the forward (``x``'s leading dims flattened).
        reps: timed repetitions per candidate (the fastest counts).
        timer: ``timer(fn, reps) -> microseconds`` (tests); default :func:`captured_time_us`.

    Returns:
        ``None`` (``F.linear``) or a ``SkinnyConfig``.

    Raises:
        ValueError: no weights, mismatched biases, or weights of different shapes, dtypes or devices.
    """
    if not weights:
        raise ValueError("tuned_linear_config: no weights to time; pass every layer's matrix of one projection")
    if len(biases) != len(weights):
        raise ValueError(f"tuned_linear_config: {len(weights)} weights but {len(biases)} biases; pass one bias (or "
                         f"None) per weight")
    w0 = weights[0]
    if any(w.shape != w0.shape or w.dtype != w0.dtype or w.device != w0.device for w in weights):
        raise ValueError("tuned_linear_config: the weights differ in shape, dtype or device; time one projection's "
                         "matrices at a time")
    n, k = w0.shape
    if (w0.device.type != "cuda" and timer is None) or w0.dtype not in SKINNY_DTYPES \
            or not SKINNY_MIN_ROWS <= rows <= SKINNY_MAX_ROWS or torch.compiler.is_compiling():
        return None
    capturing = w0.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    card = torch.cuda.get_device_name(w0.device) if w0.device.type == "cuda" else w0.device.type
    blas = torch.backends.cuda.preferred_blas_library().name if w0.device.type == "cuda" else "cpu"
    key = (card, w0.dtype, rows, n, k, blas)
    if key in _PICKS:
        return _PICKS[key]
    if capturing:
        return None
    timer = timer or captured_time_us
    x = torch.randn(rows, k, device=w0.device, dtype=w0.dtype)
    scale = torch.ones(k, device=w0.device, dtype=w0.dtype)
    pairs = list(zip(weights, biases))

    def chain(linear: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        # each product after a fused norm launch, as a forward runs it (a BLAS kernel ends the PDL chain)
        return [linear(add_rms_norm(x, None, scale, 1e-6)[1], w, b) for w, b in pairs]

    times = {None: timer(lambda: chain(F.linear), reps)}
    for config in dict.fromkeys((skinny_config(rows, n, k), *SKINNY_TUNE_CONFIGS)):
        try:
            times[config] = timer(lambda c=config: chain(functools.partial(linear_skinny, config=c)), reps)
        except _LAUNCH_ERRORS:
            continue
    _PICKS[key] = pick_fastest(times, None)
    return _PICKS[key]
