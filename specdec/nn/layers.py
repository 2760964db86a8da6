"""Decoder building blocks shared by every head: RMSNorm, the SwiGLU MLP and pre-norm Llama decoder layers.

A decoder layer is attention then an MLP, each around a residual::

    x, r = attention_input(hidden, embeds)      # what attention reads, and the residual
    h    = r + Attn(x)
    out  = h + MLP(post_attention_layernorm(h))

The variants differ only in ``attention_input``:

- :class:`DecoderLayer` (``input_norm=True``): ``(input_layernorm(hidden), hidden)``, the Llama layer.
- :class:`DecoderLayer` (``input_norm=False``): ``(hidden, hidden)``, EAGLE-1's layer 0.
- :class:`FusedInputDecoderLayer`: ``(cat(input_layernorm(embeds), hidden_norm(hidden)), hidden)``, attention
  over ``2H``; EAGLE-3's layer 0 (``norm_before_residual`` takes the residual from ``hidden_norm(hidden)``).

Under :func:`~specdec.nn.inference.fused_inference` (no gradient, CUDA) the blocks run fused projections and
one-launch element-wise kernels, the same arithmetic (:mod:`specdec.nn.inference`).

Parameter names are HF Llama's (``self_attn.q_proj``, ``mlp.gate_proj``, ``input_layernorm``, ...), so state
dicts of heads built from these layers keep the public checkpoints' key names.

References:
    Touvron et al., "LLaMA", arXiv 2302.13971; Zhang & Sennrich, "Root Mean Square Layer Normalization",
    arXiv 1910.07467; Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202; EAGLE-3 arXiv 2503.01840.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.decoder_ops import add_rms_norm, silu_mul
from ..kernels.fp8 import Fp8Rows
from .attention import AttendFn, Attention
from .fp8 import reads_fp8_rows
from .inference import apply_linear, fused_inference, fused_linear, inference_linear
from .linear import zero_linear

__all__ = ["DecoderConfig", "RMSNorm", "SwiGLU", "DecoderLayer", "FusedInputDecoderLayer"]


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes of one decoder layer.

    Attributes:
        hidden_size: ``H``.
        intermediate_size: SwiGLU width.
        num_attention_heads, num_key_value_heads: query heads and key/value heads (GQA when they differ).
        head_dim: per-head width ``d``.
        rms_norm_eps: RMSNorm epsilon.
        qkv_bias: q/k/v projections have biases.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale, statistics in float32 (as HF ``LlamaRMSNorm``).

    .. math::
        y = w \\odot \\mathrm{cast}\\big(x / \\sqrt{\\mathrm{mean}(x^2) + \\epsilon}\\big)

    The normalisation runs in float32 and is cast back to the input dtype *before* the weight.

    Args:
        size: width of the last dimension.
        eps: ``epsilon``.

    References:
        RMSNorm arXiv 1910.07467.
    """

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension.

        Args:
            x: Shape ``[..., size]``.

        Returns:
            Shape ``[..., size]``.
        """
        if fused_inference(x) and x.dtype == self.weight.dtype:
            return add_rms_norm(x, None, self.weight, self.eps)[1]
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor, *,
                    fp8_out: bool = False) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
        """``(h, norm(h))`` with ``h = residual + x``: one launch on the fused inference path.

        Args:
            x: Shape ``[..., size]``.
            residual: Shape ``[..., size]``.
            fp8_out: the consumer is float8 (:attr:`SwiGLU.fp8_input`): on the fused inference path ``normed``
                comes rounded to float8 by the same launch (:class:`~specdec.kernels.fp8.Fp8Rows`).

        Returns:
            ``(h, normed)``, each of ``x``'s shape.
        """
        if fused_inference(x) and x.dtype == residual.dtype == self.weight.dtype:
            return add_rms_norm(residual, x, self.weight, self.eps, fp8_out=fp8_out)
        h = residual + x
        return h, self.forward(h)


class SwiGLU(nn.Module):
    """The Llama MLP: ``down(silu(gate(x)) * up(x))``, no biases.

    Args:
        hidden_size: ``H``.
        intermediate_size: ``I``.

    References:
        GLU variants arXiv 2002.05202.
    """

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = zero_linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = zero_linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = zero_linear(intermediate_size, hidden_size, bias=False)

    @property
    def fp8_input(self) -> bool:
        """Whether ``[gate; up]`` rounds its rows to float8 (:func:`~specdec.nn.fp8.quantize_fp8_`,
        :func:`~specdec.nn.quantize_int4_`), so that the MLP's input may come rounded already
        (:meth:`RMSNorm.add_forward`'s ``fp8_out``)."""
        return reads_fp8_rows(self.gate_proj) and reads_fp8_rows(self.up_proj)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        """Apply the MLP.

        Args:
            x: Shape ``[..., H]`` (or, on the fused inference path of a float8 MLP, those rows rounded to float8:
                :class:`~specdec.kernels.fp8.Fp8Rows`).

        Returns:
            Shape ``[..., H]``.
        """
        if isinstance(x, Fp8Rows) or fused_inference(x):  # a float8 down_proj reads SiLU-mul's rows rounded by it
            weight, bias = fused_linear(self, ("gate_proj", "up_proj"))
            act = silu_mul(inference_linear(x, weight, bias), fp8_out=reads_fp8_rows(self.down_proj))
            return apply_linear(self.down_proj, act)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A pre-norm Llama decoder layer; attention runs through a caller-supplied ``attend``.

    Args:
        config: the layer's :class:`DecoderConfig`.
        input_norm: normalise the attention input with ``input_layernorm`` (False: EAGLE-1's layer 0, which
            has no such weight).
        attention_in: width the q/k/v projections read (default ``H``).

    References:
        LLaMA arXiv 2302.13971; EAGLE arXiv 2401.15077 (layer 0 without input norm).
    """

    def __init__(self, config: DecoderConfig, *, input_norm: bool = True, attention_in: int | None = None):
        super().__init__()
        H = config.hidden_size
        self.input_layernorm = RMSNorm(H, config.rms_norm_eps) if input_norm else nn.Identity()
        self.self_attn = Attention(attention_in or H, H, config.num_attention_heads, config.num_key_value_heads,
                                   config.head_dim, bias=config.qkv_bias)
        self.post_attention_layernorm = RMSNorm(H, config.rms_norm_eps)
        self.mlp = SwiGLU(H, config.intermediate_size)

    def attention_input(self, hidden: torch.Tensor, embeds: torch.Tensor | None = None):
        """What attention reads and the residual it adds to.

        Args:
            hidden: Shape ``[B, T, H]``.
            embeds: unused here (read by :class:`FusedInputDecoderLayer`).

        Returns:
            ``(x [B, T, H], residual [B, T, H])``.
        """
        return self.input_layernorm(hidden), hidden

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: AttendFn,
                embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Run the layer.

        Args:
            hidden: Shape ``[B, T, H]``.
            cos: Shape ``[B, 1, T, d]``, RoPE table.
            sin: Shape ``[B, 1, T, d]``.
            attend: the attention computation (:mod:`specdec.nn.attention`).
            embeds: Shape ``[B, T, H]``, token embeddings (fused-input layers only).

        Returns:
            Shape ``[B, T, H]``.
        """
        x, residual = self.attention_input(hidden, embeds)
        hidden, normed = self.post_attention_layernorm.add_forward(self.self_attn(x, cos, sin, attend), residual,
                                                                   fp8_out=self.mlp.fp8_input)
        return hidden + self.mlp(normed)


class FusedInputDecoderLayer(DecoderLayer):
    """A decoder layer whose attention reads ``cat(input_layernorm(embeds), hidden_norm(hidden))`` (``2H``).

    .. math::
        x = [\\mathrm{LN}_e(e); \\mathrm{LN}_h(g)], \\qquad r = g \\;(\\text{or } \\mathrm{LN}_h(g)
        \\text{ with norm\\_before\\_residual})

    Args:
        config: the layer's :class:`DecoderConfig`.
        norm_before_residual: take the residual from ``hidden_norm(hidden)`` instead of ``hidden``.

    References:
        EAGLE-3 arXiv 2503.01840 (authors' ``midlayer``); vLLM / speculators ``norm_before_residual``.
    """

    def __init__(self, config: DecoderConfig, *, norm_before_residual: bool = False):
        super().__init__(config, attention_in=2 * config.hidden_size)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def attention_input(self, hidden: torch.Tensor, embeds: torch.Tensor | None = None):
        """The fused input and the residual.

        Args:
            hidden: Shape ``[B, T, H]``.
            embeds: Shape ``[B, T, H]``, required.

        Returns:
            ``(x [B, T, 2H], residual [B, T, H])``.
        """
        if embeds is None:
            raise ValueError("a fused-input layer reads token embeddings: pass embeds=[B, T, H]")
        normed = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        return x, (normed if self.norm_before_residual else hidden)
