"""4-bit weights for a draft head's linear layers (inference only), a step below :mod:`specdec.nn.fp8`.

:func:`quantize_int4_` replaces a module's ``nn.Linear`` s by :class:`Int4Linear` (4-bit codes, one scale per
``group`` inputs of a row; the rows rounded to float8 at every call; the product on the float8 tensor cores:
:func:`specdec.kernels.linear_int4`), and gives a head that reads the target's ``lm_head`` (EAGLE-1, DFlash /
DSpark) a 4-bit copy of it. A forward reads a quarter of the bfloat16 head's weight bytes (plus the scales: 1/32 of
the codes' bytes at 128 inputs per scale, 1/8 at 32): at the Llama-2-7B shape an EAGLE-1 head forward (FR-Spec
8,192) ~140 MB instead of 269 in float8.

**Lossless, drafts changed**, as for float8: only the drafter is rounded; the target verifies every draft with its
own weights, so greedy outputs stay identical and sampled ones keep the target's law. The drafts, and so tau, move
further from the bfloat16 head's than float8's do; smaller groups keep more (session 46, an EAGLE-1 head of the
fixture under EAGLE-2, 10 prompts: tau 2.684 unrounded, 2.669 float8, 2.589 / 2.596 / 2.646 at 128 / 64 / 32
inputs per scale). Measure it on your head: ``examples/bench_fast.py --int4-heads``. Quantize a trained head, for
inference, after :meth:`~specdec.heads.Eagle1Head.restrict_vocab` and after moving it to its device, and build its
drafter afterwards (captured graphs hold the layers they were captured on).

A layer whose input width is not a multiple of ``2 * group`` is padded with zero weights to the next one
(:mod:`specdec.kernels.int4`'s layout; at most one chunk per row more).
"""
from __future__ import annotations

import torch
from torch import nn

from ..kernels.fp8 import Fp8Rows
from ..kernels.int4 import INT4_GROUPS, Int4Weight, linear_int4, pack_int4
from .fp8 import RoundedRowsLinear, round_linears_

__all__ = ["Int4Linear", "quantize_int4_"]


class Int4Linear(RoundedRowsLinear):
    """``y = x @ W4^T + b`` with 4-bit weights and ``x``'s rows rounded to float8 (:func:`specdec.kernels.linear_int4`),
    for inference (see the module).

    Args:
        weight: Shape ``[out_features, in_features]``, the weight to round (float, finite).
        bias: Shape ``[out_features]`` or ``None``: kept in its dtype (as a buffer).
        group: inputs per scale, one of :data:`~specdec.kernels.INT4_GROUPS`.
        persistent: whether the buffers enter ``state_dict`` (``False`` for a copy of a weight that is not the
            module's own, e.g. a head's view of the target's ``lm_head``).

    Attributes:
        in_features, out_features, group: the widths and the group size.
        weight_codes: Shape ``[out_features, K_pad / 2]`` ``uint8`` (``K_pad``: ``in_features`` rounded up to a
            multiple of ``2 * group``).
        scale_bits: Shape ``[K_pad / group, out_features]`` ``int32`` (the float32 scales' bits, times 2^9).
        bias: Shape ``[out_features]`` or ``None``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, group: int = 128,
                 persistent: bool = True):
        super().__init__()
        with torch.no_grad():
            packed = pack_int4(weight, group)  # checks the weight and the group
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"Int4Linear: bias must have shape [out_features] = [{weight.shape[0]}] or be None")
        self.out_features, self.in_features = weight.shape
        self.group = group
        self.register_buffer("weight_codes", packed.codes, persistent=persistent)
        self.register_buffer("scale_bits", packed.scales.view(torch.int32), persistent=persistent)
        self.register_buffer("bias", None if bias is None else bias.detach().clone(), persistent=persistent)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: int = 128) -> Int4Linear:
        """The layer ``linear`` rounded (same device; the bias kept in its dtype)."""
        return cls(linear.weight, linear.bias, group=group)

    def stored(self) -> tuple[torch.Tensor, ...]:
        """``(weight_codes, scale_bits)``."""
        return self.weight_codes, self.scale_bits

    @property
    def int4_weight(self) -> Int4Weight:
        """The :class:`~specdec.kernels.Int4Weight` as views of the stored bytes (no copy)."""
        return Int4Weight(self.weight_codes, self.scale_bits.view(torch.float32), self.group)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        """Shape ``[..., in_features]`` -> ``[..., out_features]``, in ``x``'s dtype; ``x`` may come rounded to
        float8 already (:class:`~specdec.kernels.fp8.Fp8Rows`)."""
        return linear_int4(x, self.int4_weight, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}, "
                f"bias={self.bias is not None}")


def quantize_int4_(module: nn.Module, *, group: int = 128, skip: tuple[str, ...] = ()) -> nn.Module:
    """Round ``module``'s linear layers to 4 bits, in place (see the module): every ``nn.Linear`` (exactly that
    class) whose qualified name is not in ``skip`` becomes an :class:`Int4Linear`, and a head that drafts through
    the target's ``lm_head`` (EAGLE-1, DFlash, DSpark: an ``lm_head_fp8`` slot) gets a 4-bit copy of it. Call it on
    a trained head, after :meth:`~specdec.heads.Eagle1Head.restrict_vocab` and after moving it to its device,
    before building its drafter.

    Args:
        module: e.g. a draft head.
        group: inputs per scale, one of :data:`~specdec.kernels.INT4_GROUPS` (smaller keeps more tau, reads more
            scales).
        skip: qualified names of linears to keep (as ``module.named_modules()`` gives them, e.g. ``"fc"``).

    Returns:
        ``module`` (modified).

    Raises:
        ValueError: as :func:`~specdec.nn.quantize_fp8_`, or a ``group`` not in
            :data:`~specdec.kernels.INT4_GROUPS`; nothing is changed then.

    Example:
        >>> head = nn.Sequential(nn.Linear(80, 32), nn.ReLU(), nn.Linear(32, 2))
        >>> _ = quantize_int4_(head.requires_grad_(False), group=32, skip=("2",))
        >>> type(head[0]).__name__, head[0].group
        ('Int4Linear', 32)
    """
    if group not in INT4_GROUPS:
        raise ValueError(f"quantize_int4_: group must be one of {INT4_GROUPS} (inputs per scale), got {group!r}")
    return round_linears_(module, skip, "quantize_int4_", "4-bit", lambda sub: Int4Linear.from_linear(sub, group),
                          lambda sub: Int4Linear(sub.lm_head_weight, getattr(sub, "lm_head_bias", None), group=group,
                                                 persistent=False))
