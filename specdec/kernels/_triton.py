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
    """Every kernel's first statement. With ``PDL`` (the launch set ``launch_pdl``, :func:`pdl_launch`): wait until
    the grids before this one in the stream have finished and their writes are visible (``griddepcontrol.wait``),
    then let the next kernel's programs be scheduled (``griddepcontrol.launch_dependents``: they start and wait in
    turn, so its launch overlaps this kernel's run instead of following it). Nothing is read or written before the
    wait, so a kernel launched early can neither see stale inputs nor overwrite what its predecessor still reads."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


_PDL: dict = {}  # (device index, override) -> the launch keywords
_PDL_OVERRIDE: list = [None]


def set_pdl(enabled: bool | None) -> None:
    """Force programmatic dependent launch on (where the GPU supports it) or off for the kernels launched from now
    on; ``None``: the default (on for compute capability 9.0 and later unless ``SPECDEC_PDL=0``). A captured graph
    keeps the launches it was captured with."""
    _PDL_OVERRIDE[0] = enabled
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


def pdl_launch() -> dict:
    """Keywords for a kernel launch: ``{"PDL": True, "launch_pdl": True}`` where :func:`pdl_enabled`, else ``{}``
    (the kernels' ``PDL`` defaults to off). Measured on the H200 (session 25, ``docs/results/fast_s25``): a CUDA
    graph of dependent small kernels runs 0.24-0.49 us per kernel faster."""
    override = _PDL_OVERRIDE[0]
    if INTERPRETED or triton is None or gdc_wait is None or override is False or not _cuda_available():
        return {}
    key = torch.cuda.current_device()
    kw = _PDL.get(key)
    if kw is None:
        on = torch.cuda.get_device_capability(key) >= (9, 0) and (
            override is True or os.environ.get("SPECDEC_PDL", "1") not in ("", "0"))
        kw = _PDL[key] = {"PDL": True, "launch_pdl": True} if on else {}
    return kw


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
