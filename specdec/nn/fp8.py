"""Float8 weights for a draft head's linear layers (inference only).

:func:`quantize_fp8_` replaces a module's ``nn.Linear`` s by :class:`Fp8Linear` (weights rounded to float8 e4m3
with one scale per output feature, rows rounded to float8 at every call, the product on float8 tensor cores:
:func:`specdec.kernels.linear_fp8`), and gives a head that reads the target's ``lm_head`` (EAGLE-1, DFlash /
DSpark) a float8 copy of it. A forward then reads half the weight bytes: at the Llama-2-7B shape an EAGLE-1 head
forward is 269 MB instead of 538 (FR-Spec 8,192), six forwards per EAGLE-2 step.

**Lossless, drafts changed.** Only the drafter is rounded; the target verifies every draft with its own weights, so
greedy outputs stay identical and sampled ones keep exactly the target's law. The drafts, and so tau, can differ
from the bfloat16 head's (measure it: ``examples/bench_fast.py --fp8-heads``). Quantize a trained head, for
inference: a quantized module has no ``weight`` parameters to train or to save as a checkpoint of the original
format (save the bfloat16 head), and its drafter must be built after quantizing (captured graphs hold the layers
they were captured on).

The rounded values are stored as raw bytes (``uint8`` codes and ``int32`` bit patterns of the float32 scales), so
``module.to(dtype)`` moves them without converting them; ``module.to(device)`` moves them as usual.

References:
    Micikevicius et al., "FP8 Formats for Deep Learning", arXiv 2209.05433 (e4m3).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from ..kernels.fp8 import FP8_DTYPE, Fp8Rows, linear_fp8, quantize_fp8_rows

__all__ = ["Fp8Weight", "RoundedRowsLinear", "Fp8Linear", "quantize_fp8_", "reads_fp8_rows"]


class Fp8Weight(NamedTuple):
    """A float8 weight as :func:`specdec.nn.inference.inference_linear` takes it in place of a tensor.

    Attributes:
        w8: Shape ``[N, K]`` :data:`~specdec.kernels.fp8.FP8_DTYPE`.
        scale: Shape ``[N]`` float32; the weight is ``w8 * scale[:, None]``.
    """

    w8: torch.Tensor
    scale: torch.Tensor


class RoundedRowsLinear(nn.Module):
    """Base of the draft-head linears whose input rows are rounded to float8 before the product
    (:class:`Fp8Linear`, :class:`~specdec.nn.Int4Linear`): a kernel that produces their input may hand them the
    rows rounded already (:class:`~specdec.kernels.fp8.Fp8Rows`, its ``fp8_out``), and the fused inference path
    concatenates such layers' stored bytes (:func:`specdec.nn.inference.cat_linears`)."""

    in_features: int
    out_features: int

    def stored(self) -> tuple[torch.Tensor, ...]:
        """The tensors that hold the weight (codes, scales), in a fixed order."""
        raise NotImplementedError


def reads_fp8_rows(layer: nn.Module) -> bool:
    """Whether ``layer`` rounds its input rows to float8 (a :class:`RoundedRowsLinear`), so that its producer may
    round them instead (``fp8_out=True``)."""
    return isinstance(layer, RoundedRowsLinear)


class Fp8Linear(RoundedRowsLinear):
    """``y = x @ (w8 * scale)^T + b`` with ``x``'s rows rounded to float8 (:func:`specdec.kernels.linear_fp8`),
    for inference (see the module).

    Args:
        weight: Shape ``[out_features, in_features]``, the weight to round (float, finite).
        bias: Shape ``[out_features]`` or ``None``: kept in its dtype (as a buffer).
        persistent: whether the buffers enter ``state_dict`` (``False`` for a copy of a weight that is not the
            module's own, e.g. a head's view of the target's ``lm_head``).

    Attributes:
        in_features, out_features: the widths.
        weight_codes: Shape ``[out_features, in_features]`` ``uint8`` (the float8 codes).
        scale_bits: Shape ``[out_features]`` ``int32`` (the float32 scales' bits).
        bias: Shape ``[out_features]`` or ``None``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, persistent: bool = True):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.dtype.is_floating_point:
            raise ValueError(f"Fp8Linear: weight must be a 2-D float tensor [out, in], got "
                             f"{getattr(weight, 'dtype', type(weight))} {tuple(getattr(weight, 'shape', ()))}")
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"Fp8Linear: bias must have shape [out_features] = [{weight.shape[0]}] or be None")
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():
            w8, scale = quantize_fp8_rows(weight.detach())
        self.register_buffer("weight_codes", w8.view(torch.uint8), persistent=persistent)
        self.register_buffer("scale_bits", scale.contiguous().view(torch.int32), persistent=persistent)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=persistent)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Fp8Linear:
        """The layer ``linear`` rounded (same device; the bias kept in its dtype)."""
        return cls(linear.weight, linear.bias)

    def stored(self) -> tuple[torch.Tensor, ...]:
        """``(weight_codes, scale_bits)``."""
        return self.weight_codes, self.scale_bits

    @property
    def fp8_weight(self) -> Fp8Weight:
        """``(w8, scale)`` as views of the stored bytes (no copy)."""
        return Fp8Weight(self.weight_codes.view(FP8_DTYPE), self.scale_bits.view(torch.float32))

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        """Shape ``[..., in_features]`` -> ``[..., out_features]``, in ``x``'s dtype; ``x`` may come rounded
        already (:class:`~specdec.kernels.fp8.Fp8Rows`: the product alone, :func:`specdec.kernels.linear_fp8_rows`)."""
        w = self.fp8_weight
        return linear_fp8(x, w.w8, w.scale, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_fp8_(module: nn.Module, *, skip: tuple[str, ...] = ()) -> nn.Module:
    """Round ``module``'s linear layers to float8, in place (see the module): every ``nn.Linear`` (exactly that
    class) whose qualified name is not in ``skip`` becomes an :class:`Fp8Linear`, and a head that drafts through the
    target's ``lm_head`` (an :class:`~specdec.heads.Eagle1Head`, a :class:`~specdec.heads.DFlashHead` or
    ``DSparkHead``: ``lm_head_weight`` and an ``lm_head_fp8`` slot) gets a float8 copy of it. Call it on a trained
    head, after :meth:`~specdec.heads.Eagle1Head.restrict_vocab` and after moving it to its device, before building
    its drafter.

    Args:
        module: e.g. a draft head.
        skip: qualified names of linears to keep (as ``module.named_modules()`` gives them, e.g. ``"fc"``).

    Returns:
        ``module`` (modified).

    Raises:
        ValueError: a name in ``skip`` is not an ``nn.Linear`` of ``module``, ``module`` is training with
            gradients on its linears (quantize for inference: ``head.eval().requires_grad_(False)``), or nothing
            would be rounded (no ``nn.Linear`` left and no ``lm_head`` slot: e.g. a
            :class:`~specdec.heads.MedusaHead`, whose projections are stacked tensors).

    Example:
        >>> head = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> _ = quantize_fp8_(head.requires_grad_(False), skip=("2",))
        >>> type(head[0]).__name__, type(head[2]).__name__
        ('Fp8Linear', 'Linear')
    """
    return round_linears_(module, skip, "quantize_fp8_", "float8", Fp8Linear.from_linear,
                          lambda sub: Fp8Linear(sub.lm_head_weight, getattr(sub, "lm_head_bias", None),
                                                persistent=False))


def round_linears_(module: nn.Module, skip: tuple[str, ...], op: str, what: str,
                   make: Callable[[nn.Linear], nn.Module], make_lm_head: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """What :func:`quantize_fp8_` and :func:`specdec.nn.quantize_int4_` share: every ``nn.Linear`` of ``module`` not
    named in ``skip`` replaced by ``make(linear)``, and every head's ``lm_head_fp8`` slot (a low-precision copy of
    the target's ``lm_head`` it drafts through) set to ``make_lm_head(head)``; the same checks and errors (``op``
    names the caller, ``what`` the format)."""
    linears = {name: sub for name, sub in module.named_modules() if type(sub) is nn.Linear}
    unknown = [name for name in skip if name not in linears]
    if unknown:
        raise ValueError(f"{op}: skip names no nn.Linear of the module: {unknown}; its linears are "
                         f"{sorted(linears)[:12]}")
    if any(p.requires_grad for sub in linears.values() for p in sub.parameters()):
        raise ValueError(f"{op}: the linears still require gradients; {what} layers are for inference "
                         "(call module.eval().requires_grad_(False) first, and train the unrounded head)")
    heads = [sub for sub in module.modules() if ("lm_head_fp8" in vars(sub) or "lm_head_fp8" in sub._modules)
             and getattr(sub, "lm_head_weight", None) is not None]
    if len(linears) == len(skip) and not heads:
        raise ValueError(f"{op}: {type(module).__name__} has no nn.Linear left to round and no lm_head slot, so "
                         f"nothing would change; {what} covers nn.Linear layers and the EAGLE-1 / DFlash / DSpark "
                         "lm_head (a Medusa head's stacked projections are not nn.Linear: keep it in bfloat16)")
    made = {name: make(sub) for name, sub in linears.items() if name not in skip}  # every check before any change
    lm_heads = [make_lm_head(sub) for sub in heads]
    for name, layer in made.items():
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, layer)
    for sub, layer in zip(heads, lm_heads):
        sub.lm_head_fp8 = layer
    return module
