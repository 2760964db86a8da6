"""The inference path of the shared blocks: fused projections and one-launch element-wise ops, where they run.

A draft head's forward at batch 1 is a few dozen small kernels per layer (three q/k/v and two gate/up
projections, RMSNorm as four element-wise kernels, RoPE as a dozen, the cache writes, the residual adds): on a
GPU their launches and their passes over tiny tensors cost more than reading the weights. When
:func:`fused_inference` says so, the blocks of :mod:`specdec.nn` run the same arithmetic as gpt-fast and
:class:`specdec.fused.FusedDecoder` do:

- :class:`~specdec.nn.Attention`: one ``[q; k; v]`` projection; over a cache
  (:func:`~specdec.nn.cached_attention`) RoPE and the key/value writes in one launch
  (:func:`specdec.kernels.rope_store`);
- :class:`~specdec.nn.SwiGLU`: one ``[gate; up]`` projection and :func:`specdec.kernels.silu_mul`;
- :class:`~specdec.nn.RMSNorm` and a layer's residual add + post-attention norm:
  :func:`specdec.kernels.add_rms_norm`;
- the projections of a forward of 2 to :func:`use_skinny_linear`'s rows (a draft tree's level, an update over the
  accepted tokens; bfloat16 / float16): :func:`specdec.kernels.linear_skinny` (:func:`inference_linear`);
- float8 layers (:func:`specdec.nn.fp8.quantize_fp8_`): fused like the others (their codes and scales
  concatenated), every row count on :func:`specdec.kernels.linear_fp8`; 4-bit layers
  (:func:`specdec.nn.quantize_int4_`) likewise on :func:`specdec.kernels.linear_int4`.

When: no gradient is being recorded, outside ``torch.compile`` (inductor fuses the plain ops itself), on CUDA
tensors (or any tensors with :func:`specdec.kernels.kernel_mode` ``"triton"``, the interpreter's tests), and while
:func:`use_fused_layers` is on (the default; :func:`specdec.fused.decode_kernels` ``fused_ops=`` sets it with the
fused decoders' setting). Training and CPU inference run the modules as written, so checkpoints, gradients and
CPU results are untouched; on CUDA an eager forward and a captured one run the same kernels, so the fast path's
drafts equal the eager path's. Results equal the plain ops' up to floating-point summation order (a fused
projection may sum in another order than three separate ones; RoPE rounds ``x cos`` then adds ``x' sin``, one
rounding, as the fused decoder does).

**Fused weights** are copies (``[W_q; W_k; W_v]``, ``[W_gate; W_up]``) cached on the module, outside its state
dict: a source weight updated in place (its version counter moved) is copied again into the same tensor at the
next eager call, so captured graphs stay valid; a replaced or moved weight gets a new copy (re-capture graphs
then, as :class:`~specdec.graphs.GraphedDrafter` does for new buffers). A captured step does not look at the
versions: a graph replays the copy it was captured on (the drafters' ``start`` runs eagerly and refreshes it).

References:
    gpt-fast (PyTorch Labs): fused ``wqkv`` and ``w1``/``w3``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels._dispatch import get_kernel_mode
from ..kernels.fp8 import FP8_DTYPE, Fp8Rows, linear_fp8
from ..kernels.int4 import Int4Weight, linear_int4
from ..kernels.skinny import SKINNY_DEFAULT_ROWS, SKINNY_MAX_ROWS, SKINNY_MIN_ROWS, linear_skinny
from .fp8 import Fp8Linear, Fp8Weight, RoundedRowsLinear
from .int4 import Int4Linear

__all__ = ["use_fused_layers", "fused_inference", "fused_linear", "cat_linears", "linear_versions",
           "use_skinny_linear", "inference_linear", "apply_linear"]

_FUSED = [True]
_SKINNY_ROWS = [SKINNY_DEFAULT_ROWS]


def use_skinny_linear(max_rows: int) -> int:
    """The most rows a projection on the fused inference path runs with :func:`specdec.kernels.linear_skinny`
    (``0`` or ``1``: never; :func:`specdec.fused.decode_kernels` ``skinny_rows=`` sets it with the fused decoders'
    setting); returns the previous setting.

    Args:
        max_rows: ``0 <= max_rows <= SKINNY_MAX_ROWS``.
    """
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or not 0 <= max_rows <= SKINNY_MAX_ROWS:
        raise ValueError(f"use_skinny_linear: max_rows must be an int in [0, {SKINNY_MAX_ROWS}] (0 turns the kernel "
                         f"off), got {max_rows!r}")
    previous, _SKINNY_ROWS[0] = _SKINNY_ROWS[0], max_rows
    return previous


def inference_linear(x: torch.Tensor | Fp8Rows, weight: torch.Tensor | Fp8Weight | Int4Weight,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; on the fused inference path, for 2 to :func:`use_skinny_linear`'s rows,
    :func:`specdec.kernels.linear_skinny` (one streaming pass over ``weight`` on tensor cores). A float8 weight
    (:class:`~specdec.nn.fp8.Fp8Weight`) runs :func:`specdec.kernels.linear_fp8` whatever the rows, or
    :func:`specdec.kernels.linear_fp8_rows` when ``x`` comes rounded already (``Fp8Rows``, from a kernel's
    ``fp8_out``). A 4-bit weight (:class:`~specdec.kernels.Int4Weight`) runs :func:`specdec.kernels.linear_int4`,
    on rows as they are or rounded already.

    Args:
        x: Shape ``[..., K]``, or :class:`~specdec.kernels.fp8.Fp8Rows` of that shape (with a float8 or 4-bit
            weight).
        weight: Shape ``[N, K]``, or an :class:`~specdec.nn.fp8.Fp8Weight` / :class:`~specdec.kernels.Int4Weight`
            of that shape.
        bias: Shape ``[N]`` or ``None``.

    Returns:
        Shape ``[..., N]``.

    Raises:
        ValueError: ``Fp8Rows`` with a weight that is neither float8 nor 4-bit.
    """
    if isinstance(x, Fp8Rows) and not isinstance(weight, (Fp8Weight, Int4Weight)):
        raise ValueError("inference_linear: rows rounded to float8 (Fp8Rows) need a float8 or 4-bit weight "
                         "(Fp8Weight, Int4Weight); ask the producing kernel for fp8_out only when its consumer "
                         "rounds its rows (specdec.nn.fp8.reads_fp8_rows)")
    if isinstance(weight, Int4Weight):
        return linear_int4(x, weight, None if bias is None else bias.to(x.dtype))
    if isinstance(weight, Fp8Weight):  # rows as they are, or rounded already (Fp8Rows)
        return linear_fp8(x, weight.w8, weight.scale, None if bias is None else bias.to(x.dtype))
    rows = x.numel() // max(x.shape[-1], 1)
    if SKINNY_MIN_ROWS <= rows <= _SKINNY_ROWS[0] and fused_inference(x):
        return linear_skinny(x, weight, bias)
    return F.linear(x, weight, bias)


def apply_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` through :func:`inference_linear` on the fused inference path (hooks and subclasses of
    ``nn.Linear`` run their own forward; so does an :class:`~specdec.nn.fp8.Fp8Linear`).

    Args:
        layer: an ``nn.Linear`` or an :class:`~specdec.nn.fp8.Fp8Linear`.
        x: Shape ``[..., in_features]``.

    Returns:
        Shape ``[..., out_features]``.
    """
    if type(layer) is nn.Linear and not layer._forward_hooks and not layer._forward_pre_hooks and fused_inference(x):
        return inference_linear(x, layer.weight, layer.bias)
    return layer(x)


def use_fused_layers(enabled: bool) -> bool:
    """Whether the blocks of :mod:`specdec.nn` take their fused inference path (see the module); returns the
    previous setting.

    Args:
        enabled: the new setting.
    """
    if not isinstance(enabled, bool):
        raise ValueError(f"use_fused_layers: enabled must be True or False, got {enabled!r}")
    previous, _FUSED[0] = _FUSED[0], enabled
    return previous


def fused_inference(x: torch.Tensor) -> bool:
    """Whether a block given the activations ``x`` runs its fused inference path (see the module).

    Args:
        x: the block's input (any shape).
    """
    if not _FUSED[0] or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    mode = get_kernel_mode()
    return mode == "triton" or (mode == "auto" and x.is_cuda)


def _tensors(lin: nn.Module) -> tuple[torch.Tensor | None, ...]:
    if isinstance(lin, RoundedRowsLinear):
        return *lin.stored(), lin.bias
    return lin.weight, lin.bias


def _key(linears: tuple[nn.Linear, ...]) -> tuple:
    return tuple((t.data_ptr(), t.shape, t.dtype, t.device) for lin in linears for t in _tensors(lin)
                 if t is not None)


def linear_versions(linears: tuple[nn.Linear, ...]) -> tuple[int, ...]:
    """The version counters of the linears' weights and biases (they move at every in-place update)."""
    return tuple(t._version for lin in linears for t in _tensors(lin) if t is not None)


def cat_linears(linears: tuple[nn.Linear, ...], out: tuple[torch.Tensor, torch.Tensor | None] | None = None
                ) -> tuple[torch.Tensor | Fp8Weight, torch.Tensor | None]:
    """``[W_1; W_2; ...]`` and the biases (zeros where one is absent; ``None`` when none has one), as new tensors or
    copied into ``out`` (an earlier result: in place, so graphs captured on it stay valid). Float8 layers (all of
    them :class:`~specdec.nn.fp8.Fp8Linear`) give an :class:`~specdec.nn.fp8.Fp8Weight` of the codes and scales,
    4-bit layers (all :class:`~specdec.nn.Int4Linear` of one group) an :class:`~specdec.kernels.Int4Weight`.

    Args:
        linears: ``nn.Linear`` s (or ``Fp8Linear`` s) with the same input width.
        out: ``(weight [sum out_i, in], bias [sum out_i] or None)`` to copy into.

    Returns:
        ``(weight, bias)``.
    """
    weight, bias = out if out is not None else (None, None)
    kinds = {(type(lin).__name__, getattr(lin, "group", None)) if isinstance(lin, RoundedRowsLinear) else "linear"
             for lin in linears}
    if len(kinds) > 1:
        raise ValueError(f"cat_linears: the layers mix weight formats {sorted(map(str, kinds))}; round all of them "
                         "alike or none (quantize_fp8_'s and quantize_int4_'s skip name whole blocks' linears "
                         "together)")
    if all(isinstance(lin, Int4Linear) for lin in linears):
        codes = None if weight is None else weight.codes
        scale = None if weight is None else weight.scales.view(torch.int32)
        codes = torch.cat([lin.weight_codes for lin in linears], 0, out=codes)
        scale = torch.cat([lin.scale_bits for lin in linears], 1, out=scale)
        weight = Int4Weight(codes, scale.view(torch.float32), linears[0].group)
    elif all(isinstance(lin, Fp8Linear) for lin in linears):
        w8 = None if weight is None else weight.w8.view(torch.uint8)
        scale = None if weight is None else weight.scale.view(torch.int32)
        w8 = torch.cat([lin.weight_codes for lin in linears], 0, out=w8)
        scale = torch.cat([lin.scale_bits for lin in linears], 0, out=scale)
        weight = Fp8Weight(w8.view(FP8_DTYPE), scale.view(torch.float32))
    else:
        weight = torch.cat([lin.weight for lin in linears], 0, out=weight)
    if any(lin.bias is not None for lin in linears):
        ref = next(lin.bias for lin in linears if lin.bias is not None)
        biases = [lin.bias if lin.bias is not None else ref.new_zeros(lin.out_features) for lin in linears]
        bias = torch.cat(biases, 0, out=bias)
    return weight, bias


def fused_linear(owner: nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor | Fp8Weight, torch.Tensor | None]:
    """``[W_1; W_2; ...]`` (and the biases, zeros where one is absent) of ``owner``'s linear layers ``names``, as
    one cached tensor (see the module for when it is copied again).

    Args:
        owner: the module holding the ``nn.Linear`` s (e.g. an :class:`~specdec.nn.Attention`).
        names: their attribute names, in output order.

    Returns:
        ``(weight [sum out_i, in], bias [sum out_i] or None)``.
    """
    linears = tuple(getattr(owner, name) for name in names)
    cache = owner.__dict__.setdefault("_fused_linears", {})
    key = _key(linears)
    entry = cache.get(names)
    if entry is not None and entry[0] == key:
        _, versions, weight, bias = entry
        if versions != linear_versions(linears):  # updated in place: copy again into the same tensors
            cat_linears(linears, out=(weight, bias))
            cache[names] = (key, linear_versions(linears), weight, bias)
        return weight, bias
    weight, bias = cat_linears(linears)
    cache[names] = (key, linear_versions(linears), weight, bias)
    return weight, bias
