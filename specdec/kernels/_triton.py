"""The optional ``triton`` import, shared by the op modules.

Without triton, ``jit`` leaves the kernel functions as plain (never launched) Python functions and ``tl`` is
``None``: the op modules still import (their annotations are strings, never evaluated), and dispatch picks
the references. Whether the kernels run under the interpreter is decided by triton when they are decorated,
i.e. when ``specdec.kernels`` is first imported; :data:`INTERPRETED` records it.
"""
from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Sequence

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None
    tl = None

INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

try:  # programmatic dependent launch (Hopper and later; triton >= 3.4)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - depends on the environment
    gdc_launch_dependents = gdc_wait = None


def jit(fn: Callable) -> Callable:
    """``triton.jit`` when triton imports; otherwise the function itself (dispatch never launches it)."""
    return triton.jit(fn) if triton is not None else fn


@jit
def pdl_start(PDL: tl.constexpr):
    """Every kernel's first statement. With ``PDL`` (the launch set ``launch_pdl``, :func:`pdl_launch`), two orders:

    - ``PDL == 2`` (the default, "early"): let the next kernel's programs be scheduled
      (``griddepcontrol.launch_dependents``), then wait until the grids before this one in the stream have finished
      and their writes are visible (``griddepcontrol.wait``). A chain of such kernels is scheduled ahead, each
      kernel's programs resident and waiting while the kernels before it run, as deep as the multiprocessors hold
      them; a grid's wait still covers its predecessor's completion, which follows that one's own wait.
    - ``PDL == True`` (``SPECDEC_PDL_EARLY=0``): wait first, then let the next kernel be scheduled, so the chain is
      scheduled one kernel ahead.
    - ``PDL == 3``: as 2, but the wait is the kernel's own :func:`pdl_wait`, after it has asked L2 for constant data
      (a product's weights, :func:`prefetch_rows_l2`).

    Nothing but constant data is touched before the wait, so a kernel launched early can neither see stale inputs
    nor overwrite what its predecessor still reads."""
    if PDL == 2:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL == 3:
        gdc_launch_dependents()
    elif PDL:
        gdc_wait()
        gdc_launch_dependents()


@jit
def pdl_wait(PDL: tl.constexpr):
    """The wait :func:`pdl_start` defers at ``PDL == 3``: a kernel launched so (:func:`pdl_launch` with
    ``prefetch=True``) may touch only constant data (a layer's weights) before calling this."""
    if PDL == 3:
        gdc_wait()


@jit
def prefetch_rows_l2(row_ptrs, nbytes, BYTES: tl.constexpr):
    """Ask L2 for the first ``min(BYTES, nbytes[i])`` bytes (rounded down to 16) at each of ``row_ptrs`` (one
    ``cp.async.bulk.prefetch.L2`` each; 16-byte aligned addresses). A hint: nothing reaches a register, and L2 is
    where every write becomes visible, so a prefetched line is never stale."""
    size = (tl.minimum(nbytes, BYTES) // 16 * 16).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [row_ptrs, size], dtype=tl.int32, is_pure=False, pack=1)


_PDL: dict = {}  # (device index) -> the launch keywords
_PDL_OVERRIDE: list = [None, None]  # enabled, early


def set_pdl(enabled: bool | None, *, early: bool | None = None) -> None:
    """Force programmatic dependent launch on (where the GPU supports it) or off for the kernels launched from now
    on; ``None``: the default (on for compute capability 9.0 and later unless ``SPECDEC_PDL=0``). ``early``: the
    early order of :func:`pdl_start` (``None``: the default, on unless ``SPECDEC_PDL_EARLY=0``). A captured graph
    keeps the launches it was captured with."""
    _PDL_OVERRIDE[:] = [enabled, early]
    _PDL.clear()


def pdl_enabled() -> bool:
    """Whether kernels launched now on the current CUDA device use programmatic dependent launch: a compute
    capability of 9.0 or later (Hopper), a triton with ``gdc_wait``, not the interpreter, and neither
    :func:`set_pdl` ``(False)`` nor ``SPECDEC_PDL=0``."""
    return bool(pdl_launch())


@functools.cache
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once (it is an NVML query or a device count per call)."""
    return torch.cuda.is_available()


def _env_on(name: str, default: str = "1") -> bool:
    return os.environ.get(name, default) not in ("", "0")


#: Bytes per weight row the draft heads' float8 / 4-bit products ask L2 for before their wait (early order only),
#: and the verify's skinny products: measured on an H100 (sessions 47 and 50, ``docs/fast_path_log.md``; session
#: 50 timed 64-512 bytes for the heads inside the 7B step, in one process: 128 the fastest with the 4-bit head).
PREFETCH_DEFAULTS = {"SPECDEC_PREFETCH": 128, "SPECDEC_PREFETCH_VERIFY": 0}


def prefetch_bytes(weight: torch.Tensor, variable: str = "SPECDEC_PREFETCH") -> int:
    """Bytes per weight row a product asks L2 for before its wait (:func:`prefetch_rows_l2`): ``variable`` names
    the environment variable that overrides :data:`PREFETCH_DEFAULTS` (``SPECDEC_PREFETCH``: the draft heads'
    float8 / 4-bit products; ``SPECDEC_PREFETCH_VERIFY``: the skinny kernel, a verify's products; ``0``: none).
    0 unless the launch is early (:func:`pdl_launch` gives ``PDL == 2``), where a product's programs are resident
    while the small kernels before it run, and where every row of ``weight`` starts on 16 bytes (the prefetch's
    alignment; a split's offset within a row is a multiple of the kernels' K chunk)."""
    return prefetch_launch(weight, variable)["PREFETCH"]


def prefetch_launch(weight: torch.Tensor, variable: str = "SPECDEC_PREFETCH") -> dict:
    """Keywords for a product launch that may prefetch ``weight``: ``PREFETCH`` (:func:`prefetch_bytes`) and
    :func:`pdl_launch`'s, with ``PDL == 3`` where it prefetches (the launch keywords resolved once)."""
    kw = pdl_launch()
    early = kw.get("PDL") == 2
    if not early or weight.data_ptr() % 16 or (weight.stride(0) * weight.element_size()) % 16:
        return {"PREFETCH": 0, **kw}
    count = int(os.environ.get(variable, PREFETCH_DEFAULTS[variable]))
    return {"PREFETCH": count, **kw, "PDL": 3} if count > 0 else {"PREFETCH": 0, **kw}


def pdl_launch(prefetch: bool = False) -> dict:
    """Keywords for a kernel launch: ``{"PDL": 2, "launch_pdl": True}`` where :func:`pdl_enabled` (``PDL: True``
    with the early order off, ``PDL: 3`` with ``prefetch``, for a kernel that calls :func:`pdl_wait` itself), else
    ``{}`` (the kernels' ``PDL`` defaults to off). Measured: a CUDA graph of dependent small kernels runs 0.24-0.49
    us per kernel faster (H200, session 25, one ahead); the 7B EAGLE-2 step ~0.2 ms faster early than one ahead
    (H100, session 47)."""
    enabled, early = _PDL_OVERRIDE
    if INTERPRETED or triton is None or gdc_wait is None or enabled is False or not _cuda_available():
        return {}
    key = torch.cuda.current_device()
    kw = _PDL.get(key)
    if kw is None:
        on = torch.cuda.get_device_capability(key) >= (9, 0) and (enabled is True or _env_on("SPECDEC_PDL"))
        early = _env_on("SPECDEC_PDL_EARLY") if early is None else early
        kw = _PDL[key] = {"PDL": 2 if early else True, "launch_pdl": True} if on else {}
    return {**kw, "PDL": 3} if prefetch and kw.get("PDL") == 2 else kw


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[R, H]`` (its leading dims flattened) with unit stride along ``H``; a copy only when it is not
    viewable so."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= max(n, 1)`` (block sizes must be powers of two)."""
    return 1 << max(int(n) - 1, 0).bit_length()


_TABLES: collections.OrderedDict = collections.OrderedDict()  # (device, pointers) -> the table on the device
_TABLES_KEPT = 32


def pointer_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The data pointers of ``tensors`` as an int64 tensor on ``device``, for one launch over all of them.

    On CUDA the table goes through pinned memory with a non-blocking copy, so building it adds no host sync; the
    last tables built are kept (a table's content is its key, so a kept one is always right), so a cache that
    stays put (the fast path's static KV cache) pays for its table once, not at every step.
    """
    pointers = tuple(t.data_ptr() for t in tensors)
    if device.type != "cuda":
        return torch.tensor(pointers, dtype=torch.int64)
    key = (device, pointers)
    table = _TABLES.get(key)
    if table is None:
        table = torch.tensor(pointers, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)
        _TABLES[key] = table
        if len(_TABLES) > _TABLES_KEPT:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(key)
    return table
