"""Neural-network blocks shared by every head: decoder layers, attention, RoPE.

- :mod:`specdec.nn.layers`: :class:`RMSNorm`, :class:`SwiGLU`, :class:`DecoderLayer` (with or without input
  norm), :class:`FusedInputDecoderLayer` (EAGLE-3's ``[norm(emb), norm(hidden)]`` input), :class:`DecoderConfig`.
- :mod:`specdec.nn.attention`: :class:`Attention` (GQA projections + RoPE), :func:`masked_attention`,
  :class:`KVCache` with :func:`cached_attention`, and the one statement of which SDPA backends masked attention
  may use (:func:`masked_sdpa_backends`, :func:`masked_sdpa_kernel`; cuDNN too inside captured steps:
  :func:`fixed_shape_attention`).
- :mod:`specdec.nn.rope`: :class:`RotaryEmbedding` (owns its ``inv_freq`` buffer), :func:`apply_rotary`.
- :mod:`specdec.nn.inference`: the blocks' fused inference path on CUDA (fused projections, the one-launch kernels
  of :mod:`specdec.kernels.decoder_ops`), :func:`use_fused_layers` to turn it off.
- :mod:`specdec.nn.fp8`: :func:`quantize_fp8_` rounds a draft head's linears to float8 (:class:`Fp8Linear`;
  inference only, lossless decoding, drafts may change); :mod:`specdec.nn.int4`: :func:`quantize_int4_` to 4-bit
  weights (:class:`Int4Linear`; the same, a quarter of the bfloat16 head's bytes).
- :mod:`specdec.nn.linear`: :func:`zero_linear`, the ``nn.Linear`` every block uses: built without drawing from
  the global RNG (its owner initialises it from its own generator).
"""
from .attention import (
    AttendFn,
    Attention,
    KVCache,
    cached_attention,
    fixed_shape_attention,
    masked_attention,
    masked_sdpa_backends,
    masked_sdpa_kernel,
    uncached_attention,
    use_tree_attention,
)
from .fp8 import Fp8Linear, Fp8Weight, quantize_fp8_
from .inference import use_fused_layers
from .int4 import Int4Linear, quantize_int4_
from .layers import DecoderConfig, DecoderLayer, FusedInputDecoderLayer, RMSNorm, SwiGLU
from .linear import zero_linear
from .rope import RotaryEmbedding, apply_rotary

__all__ = [
    "AttendFn", "Attention", "KVCache", "cached_attention", "uncached_attention", "masked_attention",
    "masked_sdpa_backends", "masked_sdpa_kernel", "fixed_shape_attention", "use_tree_attention", "DecoderConfig",
    "DecoderLayer",
    "FusedInputDecoderLayer",
    "RMSNorm", "SwiGLU", "RotaryEmbedding", "apply_rotary", "zero_linear", "use_fused_layers",
    "Fp8Linear", "Fp8Weight", "quantize_fp8_", "Int4Linear", "quantize_int4_",
]
