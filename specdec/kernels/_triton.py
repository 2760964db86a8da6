"""The optional ``triton`` import, shared by the op modules.

Without triton, ``jit`` leaves the kernel functions as plain (never launched) Python functions and ``tl`` is
``None``: the op modules still import (their annotations are strings, never evaluated), and dispatch picks
the references. Whether the kernels run under the interpreter is decided by triton when they are decorated,
i.e. when ``specdec.kernels`` is first imported; :data:`INTERPRETED` records it.
"""
from __future__ import annotations

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


def next_pow2(n: int) -> int:
    """Smallest power of two ``>= max(n, 1)`` (block sizes must be powers of two)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def pointer_table(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The data pointers of ``tensors`` as an int64 tensor on ``device``, for one launch over all of them.

    On CUDA the table goes through pinned memory with a non-blocking copy, so building it adds no host sync.
    """
    table = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    if device.type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table
