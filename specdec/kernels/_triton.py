"""The optional ``triton`` import, shared by the op modules.

Without triton, ``jit`` leaves the kernel functions as plain (never launched) Python functions and ``tl`` is
``None``: the op modules still import (their annotations are strings, never evaluated), and dispatch picks
the references. Whether the kernels run under the interpreter is decided by triton when they are decorated,
i.e. when ``specdec.kernels`` is first imported; :data:`INTERPRETED` records it.
"""
from __future__ import annotations

import collections
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


def jit(fn: Callable) -> Callable:
    """``triton.jit`` when triton imports; otherwise the function itself (dispatch never launches it)."""
    return triton.jit(fn) if triton is not None else fn


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
