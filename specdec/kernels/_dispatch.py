"""Which implementation an op runs: the Triton kernel or its torch reference.

Rule (``mode="auto"``, the default): the kernel when every tensor argument lives on a CUDA device and
``triton`` imports, outside ``torch.compile``; the reference otherwise (inside a compiled function inductor fuses
the reference's ops). ``mode="triton"`` forces the kernel (on CPU tensors this needs the
Triton interpreter, ``TRITON_INTERPRET=1`` set before ``specdec.kernels`` is imported); ``mode="torch"``
forces the reference. Tests and benchmarks switch with :func:`kernel_mode`.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

__all__ = ["KERNEL_MODES", "kernel_mode", "set_kernel_mode", "get_kernel_mode", "triton_available",
           "interpreter_enabled"]

#: The accepted modes: pick by device, force the kernel, force the reference.
KERNEL_MODES = ("auto", "triton", "torch")

_mode = "auto"


def triton_available() -> bool:
    """Whether ``triton`` imports here (the kernels are defined only then)."""
    from ._triton import triton

    return triton is not None


def interpreter_enabled() -> bool:
    """Whether the kernels were created under the Triton interpreter (``TRITON_INTERPRET=1``), so that they
    run on CPU tensors."""
    from ._triton import INTERPRETED

    return INTERPRETED


def get_kernel_mode() -> str:
    """The current mode, one of :data:`KERNEL_MODES`."""
    return _mode


def set_kernel_mode(mode: str) -> str:
    """Set the mode for every op of ``specdec.kernels``; returns the previous one.

    Args:
        mode: ``"auto"`` (kernel on CUDA tensors when triton imports, reference otherwise), ``"triton"``
            (always the kernel) or ``"torch"`` (always the reference).

    Returns:
        The mode that was in force.
    """
    global _mode
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernel mode must be one of {KERNEL_MODES}, got {mode!r}")
    previous, _mode = _mode, mode
    return previous


@contextlib.contextmanager
def kernel_mode(mode: str) -> Iterator[None]:
    """Context manager: run the ops of ``specdec.kernels`` in ``mode`` inside the block.

    Example:
        >>> with kernel_mode("torch"):   # the references, whatever the device
        ...     pass

    Args:
        mode: one of :data:`KERNEL_MODES`.
    """
    previous = set_kernel_mode(mode)
    try:
        yield
    finally:
        set_kernel_mode(previous)


def use_kernel(op: str, *tensors: torch.Tensor) -> bool:
    """Decide, for one call of ``op``, whether to launch the kernel (True) or run the reference (False)."""
    if _mode == "torch":
        return False
    if _mode == "auto":
        # Inside torch.compile (generate(fast="compile")) the reference's torch ops are traced and fused by
        # inductor instead: the launchers' byte views of bool tensors do not lower there.
        return triton_available() and all(t.is_cuda for t in tensors) and not torch.compiler.is_compiling()
    if not triton_available():
        raise RuntimeError(
            f"{op}: kernel mode 'triton' was forced but triton does not import here; install triton or use "
            f"kernel_mode('auto') / kernel_mode('torch')"
        )
    if not all(t.is_cuda for t in tensors) and not interpreter_enabled():
        raise RuntimeError(
            f"{op}: kernel mode 'triton' on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 in the "
            f"environment before importing specdec.kernels (currently "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}), or move the tensors to a CUDA device"
        )
    return True
