"""Rotary position embedding (RoPE), rotate-half layout as in HF Llama.

.. math::
    \\theta_j = \\text{base}^{-2j / d} / s, \\qquad
    \\mathrm{RoPE}(x)_p = x \\cos(p\\,\\theta) + \\mathrm{rotate\\_half}(x) \\sin(p\\,\\theta)

with ``d`` the head width, ``s`` a linear scaling factor (positions divided by ``s``) and
``rotate_half([a, b]) = [-b, a]`` over the two halves of the last dimension.

References:
    Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864,
    https://arxiv.org/abs/2104.09864; HF ``LlamaRotaryEmbedding`` / ``apply_rotary_pos_emb``.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryEmbedding", "apply_rotary"]


class RotaryEmbedding(nn.Module):
    """RoPE tables for explicit positions; the module owns its inverse frequencies as a float32 buffer.

    The buffer is non-persistent (never in a state dict) and stays float32 whatever ``.to(dtype)`` asks: it is
    recomputed on the new device instead of being rounded, so the tables are the same on every device and dtype.

    Args:
        head_dim: ``d``, the rotated width (even).
        theta: the RoPE base (``rope_theta``).
        scaling_factor: linear scaling ``s``; 1.0 is plain RoPE.

    Example:
        >>> rope = RotaryEmbedding(8)
        >>> cos, sin = rope(torch.arange(5)[None], torch.float32)
        >>> cos.shape
        torch.Size([1, 1, 5, 8])

    References:
        RoFormer arXiv 2104.09864.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling_factor: float = 1.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of channels: head_dim must be even, got {head_dim}")
        self.head_dim, self.theta, self.scaling_factor = head_dim, float(theta), float(scaling_factor)
        self.register_buffer("inv_freq", self._inv_freq(torch.device("cpu")), persistent=False)

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        exponents = torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32) / self.head_dim
        return 1.0 / (self.theta ** exponents) / self.scaling_factor

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) casts every floating buffer; bf16 frequencies would put positions off by whole
        # radians. Recompute in float32 on wherever the buffer went instead.
        super()._apply(fn, recurse)
        self.inv_freq = self._inv_freq(self.inv_freq.device)
        return self

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, scaling_factor={self.scaling_factor}"

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine and sine tables at the given positions, ready to broadcast over attention heads.

        Args:
            positions: Shape ``[B, T]`` int64, RoPE positions.
            dtype: dtype of the returned tables (the activations').

        Returns:
            ``(cos, sin)``, each of shape ``[B, 1, T, d]``.
        """
        angles = positions.float()[..., None] * self.inv_freq.to(positions.device)
        angles = torch.cat([angles, angles], dim=-1)[:, None]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys by their positions: ``x cos + rotate_half(x) sin``.

    Args:
        x: Shape ``[B, h, T, d]``.
        cos: Shape ``[B, 1, T, d]`` (from :class:`RotaryEmbedding`).
        sin: Shape ``[B, 1, T, d]``.

    Returns:
        Shape ``[B, h, T, d]``.

    References:
        RoFormer arXiv 2104.09864 (rotate-half layout as HF Llama).
    """
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
