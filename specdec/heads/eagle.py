"""EAGLE draft heads: a feature-conditioned decoder layer that extrapolates the target's hidden states.

Two heads share one skeleton (``fc`` -> Llama decoder layer(s) of :mod:`specdec.nn` -> logits) and one calling
convention; they differ in layer 0 and the output:

- :class:`Eagle1Head` (EAGLE-1 / EAGLE-2). Input at position ``t`` is ``fc(cat(embed(x_{t+1}), f_t))`` with
  ``f_t`` the target's last hidden state *after* its final norm (the vector fed to ``lm_head``). Layer 0 has no
  input norm (``DecoderLayer(input_norm=False)``), there is no final norm, and logits come from the target's own
  ``lm_head``.
- :class:`Eagle3Head` (EAGLE-3). ``fc`` fuses three target layers (``3 H_t -> H``); layer 0
  (``FusedInputDecoderLayer``) attends over
  ``cat(input_layernorm(embed(x_{t+1})), hidden_norm(h_t))`` (q/k/v read ``2H``) with the residual taken from
  the un-normed ``h_t``; an own ``norm`` and ``lm_head`` over a reduced draft vocabulary mapped back with
  ``d2t`` (``target_id = i + d2t[i]``). Later draft steps feed the head's own pre-norm output back as ``h``.

Calling convention (both heads)::

    hidden = head.features_to_hidden(features)           # committed tokens: target features -> [B, T, H]
    out    = head(input_ids, hidden, positions, ...)     # [B, T, H], pre-norm; input_ids = the *next* tokens
    logits = head.logits(out)                             # [B, T, V_draft]
    ids    = head.draft_to_target(logits.argmax(-1))      # draft-vocabulary ids -> target ids

A tree node at depth ``d`` calls ``head(node_token, parent_out, root_position + d - 1)``: its ``hidden`` is its
parent's output (EAGLE-3 skips ``fc`` there, exactly as the authors' code does).

The target's embeddings (and, for EAGLE-1, its ``lm_head``) are held as *non-persistent buffers* that share
the target's storage: frozen, not trained, never saved.

References:
    - Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", ICML 2024,
      arXiv 2401.15077, https://arxiv.org/abs/2401.15077
    - Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", EMNLP 2024,
      arXiv 2406.16858, https://arxiv.org/abs/2406.16858
    - Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via Training-Time Test",
      arXiv 2503.01840, https://arxiv.org/abs/2503.01840
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.decoder_ops import embed_concat
from ..nn import (
    AttendFn,
    DecoderConfig,
    DecoderLayer,
    FusedInputDecoderLayer,
    KVCache,
    RMSNorm,
    RotaryEmbedding,
    cached_attention,
    uncached_attention,
    zero_linear,
)
from ..nn.fp8 import reads_fp8_rows
from ..nn.inference import apply_linear, fused_inference, inference_linear
from .common import target_dims, text_config

__all__ = [
    "EagleConfig",
    "HeadCache",
    "Eagle1Head",
    "Eagle3Head",
    "default_feature_layers",
    "target_dims",
    "check_draft_vocab",
]

# The KV cache of a head's decoder layers: keys/values [num_layers, B, num_kv_heads, C, head_dim], slot = position.
HeadCache = KVCache


# --------------------------------------------------------------------------------------------------------
# Configuration and target introspection
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EagleConfig:
    """Sizes of an EAGLE head (one small record, shared by both heads).

    Attributes:
        hidden_size: ``H``, the head's width.
        intermediate_size: SwiGLU width of the MLP.
        num_attention_heads, num_key_value_heads: attention heads (GQA when they differ).
        vocab_size: the *target's* vocabulary size ``V``.
        feature_layers: HF ``hidden_states`` indices of the target the head reads (``i`` = input of decoder
            layer ``i``; ``num_hidden_layers`` = final output after the norm). EAGLE-1: one entry (the last);
            EAGLE-3: three (low, mid, high).
        head_dim: per-head width (default ``hidden_size // num_attention_heads``).
        num_layers: decoder layers of the head (the published heads use 1).
        rms_norm_eps, rope_theta: as in the target's Llama config.
        rope_scaling_factor: linear RoPE scaling (positions are divided by it); 1.0 = plain RoPE.
        fc_bias: EAGLE-1 only: ``fc`` has a bias (the authors' default; their config key ``bias``).
        qkv_bias: q/k/v projections have biases (Qwen2-style drafts).
        draft_vocab_size: EAGLE-3 only: size of the reduced draft vocabulary (default ``vocab_size``).
        target_hidden_size: EAGLE-3 only: the target's width ``H_t`` if it differs from ``H``.
        norm_before_residual: EAGLE-3 only: take the residual from ``hidden_norm(h)`` instead of ``h``
            (speculators' flag; some SpecForge Qwen3 drafts).
        initializer_range: std of the normal init of fresh weights.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    feature_layers: tuple[int, ...]
    head_dim: int | None = None
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0
    fc_bias: bool = True
    qkv_bias: bool = False
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    norm_before_residual: bool = False
    initializer_range: float = field(default=0.02, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads}: give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must lie in [1, vocab_size "
                             f"{self.vocab_size}]")

    @property
    def draft_vocab(self) -> int:
        """Rows of the head's logits: ``draft_vocab_size`` or the target vocabulary."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def feature_size(self) -> int:
        """Width of one target feature: ``target_hidden_size`` or ``hidden_size``."""
        return self.target_hidden_size or self.hidden_size

    @property
    def decoder(self) -> DecoderConfig:
        """The sizes of each of the head's decoder layers."""
        return DecoderConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                             num_attention_heads=self.num_attention_heads,
                             num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                             rms_norm_eps=self.rms_norm_eps, qkv_bias=self.qkv_bias)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


def default_feature_layers(num_target_layers: int, kind: str) -> tuple[int, ...]:
    """Target hidden-state layers an EAGLE head reads by default (HF ``hidden_states`` indices).

    Args:
        num_target_layers: ``N``, decoder layers of the target.
        kind: ``"eagle1"`` (the final, normed output: ``(N,)``) or ``"eagle3"`` (low/mid/high:
            ``(2, N // 2, N - 3)``, the EAGLE-3 / vLLM / speculators default; index ``i`` = input of layer ``i``).

    Returns:
        A tuple of layer indices.

    References:
        EAGLE-3 arXiv 2503.01840 (feature fusion); vLLM ``eagle_aux_hidden_state_layer_ids`` default.
    """
    if kind == "eagle1":
        return (num_target_layers,)
    if kind == "eagle3":
        if num_target_layers < 4:
            raise ValueError(f"the EAGLE-3 default layers (2, N//2, N-3) need a target with >= 4 layers, got "
                             f"{num_target_layers}: pass feature_layers explicitly")
        return (2, num_target_layers // 2, num_target_layers - 3)
    raise ValueError(f"kind must be 'eagle1' or 'eagle3', got {kind!r}")


def _config_from_target(target, feature_layers, **overrides) -> EagleConfig:
    config = text_config(target)
    hidden, _, vocab = target_dims(target)
    heads = int(config.num_attention_heads)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    sizes = dict(
        hidden_size=hidden,
        intermediate_size=int(getattr(config, "intermediate_size", 4 * hidden)),
        num_attention_heads=heads,
        num_key_value_heads=int(kv),
        head_dim=int(head_dim),
        vocab_size=vocab,
        feature_layers=tuple(feature_layers),
        rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(config),
        initializer_range=float(getattr(config, "initializer_range", 0.02)),
    )
    sizes.update({k: v for k, v in overrides.items() if v is not None})
    return EagleConfig(**sizes)


# --------------------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------------------


class _EagleHead(nn.Module):
    """Shared skeleton: frozen target embeddings, a stack of :mod:`specdec.nn` decoder layers, RoPE.

    ``first_layer`` is layer 0 (the variant that makes the head an EAGLE-1 or an EAGLE-3 head); the
    ``num_layers - 1`` layers after it are plain Llama layers.
    """

    kind = ""

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, first_layer: DecoderLayer):
        super().__init__()
        if embed_weight.dim() != 2 or embed_weight.shape[0] != config.vocab_size:
            raise ValueError(f"embed_weight must have shape [vocab_size={config.vocab_size}, H], got "
                             f"{tuple(embed_weight.shape)}")
        self.config = config
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling_factor)
        rest = [DecoderLayer(config.decoder) for _ in range(config.num_layers - 1)]
        self.layers = nn.ModuleList([first_layer, *rest])

    def _init_weights(self, seed: int = 0) -> None:
        std = self.config.initializer_range
        generator = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                with torch.no_grad():
                    w = torch.randn(module.weight.shape, generator=generator) * std
                    module.weight.copy_(w)
                    if module.bias is not None:
                        module.bias.zero_()

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """HF ``hidden_states`` indices of the target this head reads."""
        return self.config.feature_layers

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the head's own weights."""
        return self.layers[0].post_attention_layernorm.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the head's weights."""
        return self.layers[0].post_attention_layernorm.weight.device

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target embeddings of token ids (frozen).

        Args:
            input_ids: Shape ``[B, T]`` int64, target-vocabulary ids.

        Returns:
            Shape ``[B, T, H]``.
        """
        return F.embedding(input_ids, self.embed_weight)

    def new_cache(self, batch_size: int, capacity: int, device=None, dtype=None) -> HeadCache:
        """Allocate a zeroed :class:`HeadCache`.

        Args:
            batch_size: ``B``.
            capacity: ``C``, slots per row.
            device, dtype: default: the head's.

        Returns:
            A :class:`HeadCache`.
        """
        c = self.config
        return HeadCache.zeros(c.num_layers, batch_size, c.num_key_value_heads, capacity, c.head_dim,
                               device=self.device if device is None else device,
                               dtype=self.dtype if dtype is None else dtype)

    def _inputs(self, input_ids: torch.Tensor, hidden: torch.Tensor):
        raise NotImplementedError

    def run_layers(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                   attend_for_layer: Callable[[int], AttendFn],
                   rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Run the head with a caller-supplied attention per layer (used by training-time test).

        Args:
            input_ids: Shape ``[B, T]`` int64 (target ids of the *next* tokens).
            hidden: Shape ``[B, T, H]``, the conditioning hidden states.
            positions: Shape ``[B, T]`` int64, RoPE positions.
            attend_for_layer: ``i -> attend(q, k, v)`` for decoder layer ``i``.
            rope: ``(cos, sin)`` ``[B, 1, T, d]``, ``self.rotary(positions, dtype)`` made by the caller (a drafter
                makes every level's at once); default: made here from ``positions``.

        Returns:
            Shape ``[B, T, H]``, the pre-norm output hidden states.
        """
        x, embeds = self._inputs(input_ids, hidden)
        cos, sin = self.rotary(positions, x.dtype) if rope is None else (t.to(x.dtype) for t in rope)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attend_for_layer(i), embeds=embeds)
        return x

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache: HeadCache | None = None,
                cache_slots: torch.Tensor | None = None, kv_length: int | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Run the head on ``T`` entries: causal, under a custom 4D mask, or over a KV cache.

        Entry ``t`` pairs ``hidden[:, t]`` (the target feature at position ``p``, or a parent's head output)
        with ``input_ids[:, t]`` (the token at ``p + 1``); its output approximates the target feature at
        ``p + 1``.

        Args:
            input_ids: Shape ``[B, T]`` int64, target-vocabulary ids.
            hidden: Shape ``[B, T, H]`` (use :meth:`features_to_hidden` for target features).
            positions: Shape ``[B, T]`` int64, RoPE positions (position of the *feature*, ``p``).
            attention_mask: Shape ``[B, 1, T, S]`` bool, True = may attend. Without a cache ``S = T``; with a
                cache ``S = kv_length`` (slots ``0..kv_length-1`` after this call's writes). ``None`` without a
                cache means causal.
            cache: a :class:`HeadCache`; this call's keys/values are written at ``cache_slots`` first.
            cache_slots: Shape ``[B, T]`` int64, the slot of each entry (required with ``cache``).
            kv_length: attend over slots ``[0, kv_length)`` (default: the whole cache).
            rope: ``(cos, sin)`` at ``positions``, ``[B, 1, T, d]`` each (see :meth:`run_layers`), or ``None``.

        Returns:
            Shape ``[B, T, H]``: pre-norm output hidden states.
        """
        if cache is None:
            return self.run_layers(input_ids, hidden, positions, uncached_attention(attention_mask), rope)
        if cache_slots is None or attention_mask is None:
            raise ValueError("with a cache, pass cache_slots [B, T] (where to write) and attention_mask "
                             "[B, 1, T, kv_length] (which slots each entry sees)")
        return self.run_layers(input_ids, hidden, positions,
                               cached_attention(cache, cache_slots, attention_mask, kv_length), rope)

    def features_to_hidden(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """Turn the target's features at committed tokens into the head's conditioning ``hidden``.

        Args:
            features: one tensor per entry of :attr:`feature_layers`, in that order.
                Shape: each ``[B, T, H_t]``.

        Returns:
            Shape ``[B, T, H]``.
        """
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits from the head's output.

        Args:
            hidden: Shape ``[..., H]``, pre-norm head output.

        Returns:
            Shape ``[..., V_draft]`` (``V_draft = V`` for EAGLE-1).
        """
        raise NotImplementedError

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target ids (identity without a reduced vocabulary).

        Args:
            draft_ids: Shape any, int64 ids in ``[0, V_draft)``.

        Returns:
            Target ids, same shape.
        """
        return draft_ids

    def _check_features(self, features: Sequence[torch.Tensor]) -> None:
        if len(features) != len(self.feature_layers):
            raise ValueError(f"this {self.kind} head reads {len(self.feature_layers)} target layers "
                             f"{self.feature_layers}, got {len(features)} feature tensors: request exactly "
                             f"its feature_layers from the target")
        for i, f in zip(self.feature_layers, features):
            if f.shape[-1] != self.config.feature_size:
                raise ValueError(f"feature of target layer {i} has size {f.shape[-1]} but the head was made for "
                                 f"a target hidden size of {self.config.feature_size}")


class Eagle1Head(_EagleHead):
    """The EAGLE-1 head (also EAGLE-2's): ``fc(cat(embed, feature))`` -> Llama layer(s), target ``lm_head``.

    .. math::
        \\hat f_{t+1} = \\mathrm{Layers}(W_{fc} [e(x_{t+1}); f_t] + b_{fc}), \\qquad
        q(x_{t+2}) = \\mathrm{softmax}(\\mathrm{lm\\_head}(\\hat f_{t+1}))

    Args:
        config: an :class:`EagleConfig` (``feature_layers`` = the target's final normed output).
        embed_weight: the target's input embeddings (frozen, shared, not saved).
            Shape: ``[V, H]``.
        lm_head_weight: the target's output projection (frozen, shared, not saved).
            Shape: ``[V, H]``.
        lm_head_bias: optional output bias. Shape: ``[V]``.

    Example:
        >>> head = Eagle1Head.from_target(model)                       # doctest: +SKIP
        >>> out = head(next_ids, head.features_to_hidden(feats), pos)  # doctest: +SKIP

    References:
        EAGLE arXiv 2401.15077 (Sec. 4, "draft model"); authors' ``cnets1.py`` (``fc`` bias default True,
        no ``input_layernorm`` in layer 0).
    """

    kind = "EAGLE-1"

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 lm_head_bias: torch.Tensor | None = None):
        super().__init__(config, embed_weight, DecoderLayer(config.decoder, input_norm=False))
        if len(config.feature_layers) != 1:
            raise ValueError(f"an EAGLE-1 head reads one target layer, got feature_layers {config.feature_layers}")
        if config.feature_size != config.hidden_size:
            raise ValueError(f"an EAGLE-1 head's width ({config.hidden_size}) must equal the target's hidden size "
                             f"({config.feature_size})")
        if lm_head_weight.shape != (config.vocab_size, config.hidden_size):
            raise ValueError(f"lm_head_weight must have shape [{config.vocab_size}, {config.hidden_size}], got "
                             f"{tuple(lm_head_weight.shape)}")
        self.fc = zero_linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)
        self.register_buffer("lm_head_bias", None if lm_head_bias is None else lm_head_bias.detach(),
                             persistent=False)
        # While the vocabulary is restricted: the full output projection (so that restrict_vocab can be undone or
        # redone) and the kept ids. None otherwise, so that .to() never converts the projection twice.
        self.register_buffer("full_lm_head_weight", None, persistent=False)
        self.register_buffer("full_lm_head_bias", None, persistent=False)
        self.register_buffer("draft_ids", None, persistent=False)  # [V'] target ids of a restricted vocabulary
        self.lm_head_fp8 = None  # a float8 copy of lm_head_weight (specdec.nn.quantize_fp8_), used when set
        self._init_weights()

    @classmethod
    def from_target(cls, target, *, num_layers: int = 1, fc_bias: bool = True,
                    intermediate_size: int | None = None,
                    draft_vocab: tuple[torch.Tensor, torch.Tensor] | torch.Tensor | None = None) -> Eagle1Head:
        """A fresh (randomly initialised) EAGLE-1 head shaped like one decoder layer of ``target``.

        Args:
            target: an HF causal LM; its embeddings and ``lm_head`` are shared, frozen.
            num_layers: decoder layers of the head.
            fc_bias: give ``fc`` a bias (the authors' default).
            intermediate_size: MLP width (default: the target's).
            draft_vocab: draft over this subset of the vocabulary (:meth:`restrict_vocab`; for inference only:
                a restricted head is not trained). ``None``: the full vocabulary.

        Returns:
            An :class:`Eagle1Head` on the target's device and dtype.

        References:
            EAGLE arXiv 2401.15077.
        """
        _, n_layers, _ = target_dims(target)
        config = _config_from_target(target, default_feature_layers(n_layers, "eagle1"), num_layers=num_layers,
                                     fc_bias=fc_bias, intermediate_size=intermediate_size)
        out = target.get_output_embeddings()
        bias = getattr(out, "bias", None)
        head = cls(config, target.get_input_embeddings().weight, out.weight, bias)
        head = head.to(device=out.weight.device, dtype=out.weight.dtype)
        return head if draft_vocab is None else head.restrict_vocab(draft_vocab)

    def _inputs(self, input_ids, hidden):
        if fused_inference(hidden):  # the embedding rows and the hidden states written side by side, one launch
            rows = embed_concat(input_ids, self.embed_weight, hidden, fp8_out=reads_fp8_rows(self.fc))
            return apply_linear(self.fc, rows), None
        e = self.embed(input_ids).to(hidden.dtype)
        return self.fc(torch.cat([e, hidden], dim=-1)), None

    def features_to_hidden(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """The single target feature (final normed hidden state), cast to the head's dtype.

        Args:
            features: ``(f,)`` with ``f`` the target's last hidden state after its final norm.
                Shape: ``[B, T, H]``.

        Returns:
            Shape ``[B, T, H]``.
        """
        self._check_features(features)
        return features[0].to(self.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target ``lm_head`` applied to the head's output (no final norm, as the authors).

        Args:
            hidden: Shape ``[..., H]``.

        Returns:
            Shape ``[..., V]``; ``[..., V']`` after :meth:`restrict_vocab` (column ``i`` = target id
            ``draft_ids[i]``).
        """
        if self.lm_head_fp8 is not None:
            return apply_linear(self.lm_head_fp8, hidden)
        w = self.lm_head_weight.to(hidden.dtype)
        b = None if self.lm_head_bias is None else self.lm_head_bias.to(hidden.dtype)
        return inference_linear(hidden, w, b)

    def restrict_vocab(self, draft_vocab: tuple[torch.Tensor, torch.Tensor] | torch.Tensor | None) -> Eagle1Head:
        """Draft over a subset of the vocabulary (FR-Spec): the ``lm_head`` keeps only the subset's rows.

        Every draft level's ``lm_head`` then reads ``V' x H`` instead of ``V x H`` weights (at the Llama-2-7B
        shape and ``V' = 8192``: 67 MB instead of 262 MB per level) and its top-k / log-softmax run over ``V'``
        columns; the scores are the head's distribution renormalised over the subset. Verification is by the
        target and unchanged, so decoding stays **lossless** (greedy outputs identical, sampled ones exactly the
        target's law); only the drafts can change, and a token outside the subset can never be drafted (pick the
        most frequent tokens: :func:`specdec.training.build_draft_vocab`,
        :func:`specdec.training.draft_vocab_size_for_coverage`). Restrict before building the drafter (a
        captured drafter keeps the logits' width it was captured with). The restriction is not saved with the
        head (EAGLE-1 checkpoints carry no ``lm_head``): apply it again after loading.

        Args:
            draft_vocab: ``(d2t, t2d)`` as :func:`~specdec.training.build_draft_vocab` returns them, or the kept
                target ids (Shape ``[V']`` int64, strictly increasing, in ``[0, V)``); ``None`` restores the full
                vocabulary.

        Returns:
            ``self`` (changed in place).

        Raises:
            ValueError: ids not strictly increasing or outside ``[0, V)``, or ``(d2t, t2d)`` inconsistent.

        Example:
            >>> d2t, t2d = build_draft_vocab(token_counts, 8192)      # doctest: +SKIP
            >>> head.restrict_vocab((d2t, t2d))                        # doctest: +SKIP

        References:
            FR-Spec, Zhao et al., arXiv 2502.14856 (frequency-ranked draft vocabulary for EAGLE-2).
        """
        if self.lm_head_fp8 is not None:
            raise ValueError("restrict_vocab: the head's lm_head is already rounded (quantize_fp8_ or "
                             "quantize_int4_); restrict the vocabulary first, then quantize")
        if self.draft_ids is None:
            full_w, full_b = self.lm_head_weight, self.lm_head_bias
        else:
            full_w, full_b = self.full_lm_head_weight, self.full_lm_head_bias
        if draft_vocab is None:
            self.lm_head_weight, self.lm_head_bias = full_w, full_b
            self.full_lm_head_weight = self.full_lm_head_bias = self.draft_ids = None
            return self
        V = self.config.vocab_size
        if isinstance(draft_vocab, (tuple, list)):
            d2t, t2d = draft_vocab
            check_draft_vocab(d2t, t2d, V)
            ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t
        else:
            ids = torch.as_tensor(draft_vocab)
        ids = ids.to(device=full_w.device, dtype=torch.long).flatten()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= V or (ids.numel() > 1 and
                                                                               bool((ids[1:] <= ids[:-1]).any())):
            raise ValueError(f"a restricted draft vocabulary must be 1..{V} strictly increasing target ids in "
                             f"[0, {V}); build one with specdec.training.build_draft_vocab(token_counts, size)")
        self.full_lm_head_weight, self.full_lm_head_bias = full_w, full_b
        self.lm_head_weight = full_w.index_select(0, ids).contiguous()
        self.lm_head_bias = None if full_b is None else full_b.index_select(0, ids).contiguous()
        self.draft_ids = ids
        return self

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map column indices of :meth:`logits` to target ids (identity unless :meth:`restrict_vocab` was used).

        Args:
            draft_ids: Shape any, int64 in ``[0, V')``.

        Returns:
            Target ids, same shape.
        """
        return draft_ids if self.draft_ids is None else self.draft_ids[draft_ids]

    def draft_id_table(self) -> torch.Tensor | None:
        """The target id of each column of :meth:`logits` (Shape ``[V']`` int64, the restricted vocabulary's ids), or
        ``None`` when the head drafts over the whole vocabulary (the identity). A drafter hands it to the tree's
        top-k (:class:`~specdec.trees.VocabMap`) instead of calling :meth:`draft_to_target` per level."""
        return self.draft_ids


class Eagle3Head(_EagleHead):
    """The EAGLE-3 head: fused low/mid/high target features, 2H-input midlayer, own norm + reduced ``lm_head``.

    .. math::
        g_t = W_{fc} [l_t; m_t; h_t], \\qquad
        a_t = \\mathrm{Attn}([\\mathrm{LN}_e(e(x_{t+1})); \\mathrm{LN}_h(g_t)]), \\quad g'_t = g_t + a_t,
        \\qquad o_t = g'_t + \\mathrm{MLP}(\\mathrm{LN}(g'_t)),
        \\qquad q = \\mathrm{softmax}(W_{lm} \\mathrm{norm}(o_t)) \\text{ over the draft vocabulary}

    Draft id ``i`` is target id ``i + d2t[i]``; ``t2d[v]`` says whether target id ``v`` is in the draft
    vocabulary. Later tree steps feed ``o_t`` (pre-norm) back as ``g`` and skip ``fc``.

    Args:
        config: an :class:`EagleConfig` with three (or more) ``feature_layers``.
        embed_weight: token embeddings, frozen, not saved (the target's unless the head has its own width).
            Shape: ``[V, H]``.
        d2t: draft-to-target offsets (default: identity). Shape: ``[V_draft]`` int64.
        t2d: target-in-draft-vocabulary mask (default: all True). Shape: ``[V]`` bool.

    References:
        EAGLE-3 arXiv 2503.01840; authors' ``cnets.py`` (``midlayer``, ``hidden_norm``, ``d2t`` offsets);
        vLLM / speculators ``norm_before_residual``.
    """

    kind = "EAGLE-3"

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, d2t: torch.Tensor | None = None,
                 t2d: torch.Tensor | None = None):
        if embed_weight.shape[-1] != config.hidden_size:
            raise ValueError(f"embed_weight has width {embed_weight.shape[-1]} but the head's hidden size is "
                             f"{config.hidden_size}")
        super().__init__(config, embed_weight,
                         FusedInputDecoderLayer(config.decoder, norm_before_residual=config.norm_before_residual))
        H, Vd = config.hidden_size, config.draft_vocab
        self.fc = zero_linear(len(config.feature_layers) * config.feature_size, H, bias=False)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = zero_linear(H, Vd, bias=False)
        if d2t is None:
            d2t = torch.zeros(Vd, dtype=torch.long)
        if t2d is None:
            t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
            t2d[torch.arange(Vd) + d2t.cpu()] = True
        check_draft_vocab(d2t, t2d, config.vocab_size)
        if d2t.shape[0] != Vd:
            raise ValueError(f"d2t has {d2t.shape[0]} entries but draft_vocab_size is {Vd}")
        self.register_buffer("d2t", d2t.detach().to(torch.long).clone())
        self.register_buffer("t2d", t2d.detach().to(torch.bool).clone())
        self._init_weights()

    @classmethod
    def from_target(cls, target, *, draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
                    feature_layers: Sequence[int] | None = None, num_layers: int = 1,
                    intermediate_size: int | None = None, norm_before_residual: bool = False) -> Eagle3Head:
        """A fresh (randomly initialised) EAGLE-3 head for ``target``.

        Args:
            target: an HF causal LM; its embeddings are shared, frozen.
            draft_vocab: ``(d2t, t2d)`` from :func:`specdec.training.build_draft_vocab`; ``None`` keeps the
                full target vocabulary.
            feature_layers: HF ``hidden_states`` indices to fuse (default ``(2, N // 2, N - 3)``).
            num_layers: decoder layers (layer 0 is the 2H-input midlayer).
            intermediate_size: MLP width (default: the target's).
            norm_before_residual: see :class:`EagleConfig`.

        Returns:
            An :class:`Eagle3Head` on the target's device and dtype.

        References:
            EAGLE-3 arXiv 2503.01840.
        """
        _, n_layers, vocab = target_dims(target)
        layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(n_layers, "eagle3")
        for i in layers:
            if not 0 <= i <= n_layers:
                raise ValueError(f"feature layer {i} is out of range for a target with {n_layers} layers "
                                 f"(HF hidden_states indices 0..{n_layers})")
        d2t, t2d = draft_vocab if draft_vocab is not None else (None, None)
        config = _config_from_target(target, layers, num_layers=num_layers, intermediate_size=intermediate_size,
                                     norm_before_residual=norm_before_residual,
                                     draft_vocab_size=None if d2t is None else int(d2t.shape[0]))
        emb = target.get_input_embeddings().weight
        head = cls(config, emb, d2t, t2d)
        return head.to(device=emb.device, dtype=emb.dtype)

    def _inputs(self, input_ids, hidden):
        return hidden, self.embed(input_ids).to(hidden.dtype)

    def features_to_hidden(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """Fuse the target's low/mid/high features with ``fc`` (``3 H_t -> H``).

        Args:
            features: one tensor per :attr:`feature_layers`, in order. Shape: each ``[B, T, H_t]``.

        Returns:
            Shape ``[B, T, H]``.
        """
        self._check_features(features)
        return apply_linear(self.fc, torch.cat([f.to(self.dtype) for f in features], dim=-1))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``lm_head(norm(hidden))`` over the draft vocabulary.

        Args:
            hidden: Shape ``[..., H]``, pre-norm head output.

        Returns:
            Shape ``[..., V_draft]``.
        """
        return apply_linear(self.lm_head, self.norm(hidden))

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """``target_id = i + d2t[i]``.

        Args:
            draft_ids: Shape any, int64 in ``[0, V_draft)``.

        Returns:
            Target ids, same shape.
        """
        return draft_ids + self.d2t[draft_ids]

    def draft_id_table(self) -> torch.Tensor:
        """``arange(V_draft) + d2t``: the target id of each draft id (Shape ``[V_draft]`` int64), made once per
        ``d2t`` (its storage and version) and kept, so that graphs captured on it stay valid; a drafter hands it to
        the tree's top-k (:class:`~specdec.trees.VocabMap`) instead of calling :meth:`draft_to_target` per level."""
        d2t = self.d2t
        key = (d2t.data_ptr(), d2t._version, d2t.device, d2t.shape[0])
        held = self.__dict__.get("_draft_id_table")
        if held is None or held[0] != key:
            with torch.no_grad():
                held = (key, torch.arange(d2t.shape[0], device=d2t.device) + d2t)
            self.__dict__["_draft_id_table"] = held
        return held[1]

    def target_to_draft_logits(self, target_logits: torch.Tensor) -> torch.Tensor:
        """Restrict target logits to the draft vocabulary (column ``i`` = target id ``i + d2t[i]``).

        Args:
            target_logits: Shape ``[..., V]``.

        Returns:
            Shape ``[..., V_draft]``.
        """
        ids = torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t
        return target_logits.index_select(-1, ids)


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int | None = None) -> None:
    """Check that ``d2t`` (offsets) and ``t2d`` (mask) describe the same draft vocabulary.

    Args:
        d2t: Shape ``[V_draft]`` int64, ``target_id = i + d2t[i]``, strictly increasing target ids.
        t2d: Shape ``[V]`` bool, True exactly at the draft vocabulary's target ids.
        vocab_size: expected ``V`` (the target's), if known.

    Raises:
        ValueError: naming the inconsistency.

    References:
        EAGLE-3 ``scandata`` (``d2t[i] = used[i] - i``); vLLM ``draft_id_to_target_id``.
    """
    if d2t.dim() != 1 or t2d.dim() != 1:
        raise ValueError(f"d2t and t2d must be 1-D, got shapes {tuple(d2t.shape)} and {tuple(t2d.shape)}")
    if vocab_size is not None and t2d.shape[0] != vocab_size:
        raise ValueError(f"t2d covers a vocabulary of {t2d.shape[0]} tokens but the target has {vocab_size}: the "
                         f"head was made for another tokenizer")
    ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t.to(torch.long)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= t2d.shape[0]):
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {t2d.shape[0]}): the head was made "
                         f"for another vocabulary")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("d2t must map draft ids to strictly increasing target ids (sorted, no duplicates)")
    if int(t2d.sum()) != d2t.shape[0] or not bool(t2d.to(ids.device)[ids].all()):
        raise ValueError(f"t2d marks {int(t2d.sum())} target ids but d2t maps {d2t.shape[0]} different ones: "
                         f"rebuild both with build_draft_vocab")
