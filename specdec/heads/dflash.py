"""DFlash and DSpark: block drafters that draft a whole block of tokens in one forward.

**DFlash.** The block is ``[x_a, m, m, ..., m]`` (``block_size`` slots): the anchor ``x_a`` (the root: the last
committed token, which the target has not run yet) at position ``a`` and ``block_size - 1`` copies of
``mask_token_id`` at ``a + 1, ...``, embedded with the *target's* input embeddings (frozen, shared, not saved).
The context is the target's hidden states at every committed position ``< a``, from several target layers,
fused by ``fc`` and normalised (``hidden_norm``)::

    c_t = hidden_norm(fc([h^{(l_1)}_t; ...; h^{(l_n)}_t]))                       t < a

In *every* draft layer the context vectors are projected by that layer's own ``k_proj`` / ``v_proj`` (with
``k_norm`` for Qwen3-style qk-norm layers; RoPE at the context's positions) and prepended to the block's keys and
values. Attention is non-causal inside the block and full over the context. The output goes through ``norm`` and
the *target's* ``lm_head`` (frozen, shared, not saved).

Which block slot drafts which level (``sample_from_anchor``, the speculators / vLLM semantics):

- ``False`` (DFlash default): slot ``k`` predicts the token *at* its own position ``a + k``; slots ``1..bs-1``
  give levels ``1..bs-1`` (``bs - 1`` drafts; the anchor slot is not sampled).
- ``True`` (DSpark default): slot ``k`` predicts the *next* token, at ``a + k + 1``; slots ``0..bs-1`` give levels
  ``1..bs`` (``bs`` drafts).

Either way level ``d`` is the token at position ``a + d``.

**DSpark** (:class:`DSparkHead`) adds (a) a low-rank Markov head: a logit bias from the previous token of the
block, ``bias(x) = W_2 W_1[x]`` with ``W_1 : [V, r]`` (a table) and ``W_2 : [r, V]`` (``"vanilla"``), or with
``W_1[x]`` gated by ``sigmoid(G [h_d; W_1[x]])`` (``"gated"``); a node at level ``d`` whose parent holds ``x``
gets logits ``z_d + bias(x)``; (b) a confidence head: ``c_d = sigmoid(w [h_d; W_1[x_{d-1}]] + b)`` (the Markov
features optional), the predicted probability that level ``d`` is accepted given that levels ``< d`` were.

Feature-layer convention: ``feature_layers`` are HF ``hidden_states`` indices (``i`` = input of decoder layer
``i`` = output of layer ``i - 1``; ``num_hidden_layers`` = the final normed output). z-lab's
``dflash_config.target_layer_ids`` read ``hidden_states[id + 1]`` (``feature_layers = target_layer_ids + 1``);
speculators' ``aux_hidden_state_layer_ids`` already store ``target_layer_ids + 1`` (``feature_layers = aux``).

State and cost per step (:meth:`DFlashHead.start`, :meth:`DFlashHead.update`, :meth:`DFlashHead.level_logits`):
the head keeps each layer's context keys and values of the committed tokens in a cache whose slot is the
token's position (rows stay aligned, nothing to compact); ``update`` projects the newly committed features into
it; a draft is one forward of the ``B x block_size`` block over the cache (the block's own keys are written past the
committed entries, where the next update overwrites them). A draft attends over the whole cache under a mask; a
host-side bound of the row lengths decides when the cache grows, so no step syncs with the device (every
``resync_every`` updates a non-blocking copy of the lengths re-tightens the bound once it has arrived).

CUDA graphs: the heads implement :class:`~specdec.drafters.parallel.ParallelDrafter`'s step hooks
(``start(static=, buffers=)``, ``draft_step``, ``absorb_step``). A step's draft attends over the whole cache (less
its trash slot) under the mask, so its shapes depend only on the batch size and the capacity; the resync (a
non-blocking copy of the lengths) is queued in the step's host-side ``finish``, outside the captured work.
``static=True`` allocates the cache with headroom and reuses an earlier run's when it fits.

References:
    Chen et al., "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036 (z-lab);
    "DSpark", arXiv 2607.05147 (Markov and confidence heads); vllm-project/speculators ``dflash`` / ``dspark``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..drafters.parallel import LevelOutput
from ..graphs import BoundMark, Step, mark_bound, run_step, settle_bound, static_buffers
from ..nn import (
    Attention,
    DecoderConfig,
    DecoderLayer,
    KVCache,
    RMSNorm,
    RotaryEmbedding,
    apply_rotary,
    cached_attention,
    zero_linear,
)
from ..nn.attention import masked_attention
from .common import target_dims, text_config

__all__ = ["DFlashConfig", "DFlashHead", "DSparkHead", "DFlashState", "default_dflash_layers"]

MARKOV_HEAD_TYPES = ("vanilla", "gated")


# --------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DFlashConfig:
    """Sizes and switches of a DFlash / DSpark head.

    Attributes:
        hidden_size: ``H``, the head's width (equals the target's: the target's ``lm_head`` reads it).
        intermediate_size: SwiGLU width.
        num_attention_heads, num_key_value_heads: attention heads (GQA when they differ).
        vocab_size: ``V``, the target's vocabulary.
        feature_layers: HF ``hidden_states`` indices of the target fused into the context (see the module doc).
        mask_token_id: the token id that fills the block's slots after the anchor.
        block_size: ``bs``, slots of one block (anchor included).
        head_dim: per-head width (default ``hidden_size // num_attention_heads``).
        num_layers: decoder layers.
        rms_norm_eps, rope_theta, rope_scaling_factor: as the target's config (linear RoPE scaling only).
        qk_norm: Qwen3-style RMSNorm of queries and keys per head (``q_norm`` / ``k_norm``), as z-lab's drafts.
        qkv_bias: q/k/v projections have biases.
        target_hidden_size: width of one target feature if it differs from ``hidden_size``.
        sample_from_anchor: see the module doc (False: ``bs - 1`` levels from slots ``1..bs-1``; True: ``bs``
            levels from slots ``0..bs-1``).
        markov_rank: DSpark: rank ``r`` of the Markov head (0: none).
        markov_head_type: DSpark: ``"vanilla"`` or ``"gated"``.
        enable_confidence_head: DSpark: predict per-level acceptance.
        confidence_head_with_markov: DSpark: the confidence head also reads ``W_1[x_{d-1}]``.
        confidence_head_alpha: DSpark: weight of the confidence BCE in training (stored with the checkpoint).
        initializer_range: std of the normal init of fresh weights.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    feature_layers: tuple[int, ...]
    mask_token_id: int
    block_size: int = 8
    head_dim: int | None = None
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling_factor: float = 1.0
    qk_norm: bool = True
    qkv_bias: bool = False
    target_hidden_size: int | None = None
    sample_from_anchor: bool = False
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    confidence_head_alpha: float = 1.0
    initializer_range: float = field(default=0.02, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads}: give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if not self.feature_layers:
            raise ValueError("feature_layers is empty: give the target layers the context fuses (HF hidden_states "
                             "indices), e.g. default_dflash_layers(num_target_layers, num_layers)")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.block_size < 2 - int(self.sample_from_anchor):
            raise ValueError(f"block_size {self.block_size} drafts no token (sample_from_anchor="
                             f"{self.sample_from_anchor}): use block_size >= 2")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the target vocabulary [0, "
                             f"{self.vocab_size}): pick a token id of the target's tokenizer")
        if self.markov_rank < 0:
            raise ValueError(f"markov_rank must be >= 0 (0: no Markov head), got {self.markov_rank}")
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"markov_head_type {self.markov_head_type!r} is not implemented: use one of "
                             f"{MARKOV_HEAD_TYPES}")
        if self.confidence_head_with_markov and self.enable_confidence_head and self.markov_rank == 0:
            raise ValueError("confidence_head_with_markov needs a Markov head: set markov_rank > 0 or "
                             "confidence_head_with_markov=False")

    @property
    def num_levels(self) -> int:
        """``D``: levels one block drafts (``bs`` with ``sample_from_anchor``, else ``bs - 1``)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def first_slot(self) -> int:
        """Block slot of level 1 (0 with ``sample_from_anchor``, else 1)."""
        return 0 if self.sample_from_anchor else 1

    @property
    def feature_size(self) -> int:
        """Width of one target feature."""
        return self.target_hidden_size or self.hidden_size

    @property
    def decoder(self) -> DecoderConfig:
        """The sizes of each decoder layer."""
        return DecoderConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                             num_attention_heads=self.num_attention_heads,
                             num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                             rms_norm_eps=self.rms_norm_eps, qkv_bias=self.qkv_bias)


def default_dflash_layers(num_target_layers: int, num_context_layers: int) -> tuple[int, ...]:
    """Target layers a fresh DFlash head reads (HF ``hidden_states`` indices), spread over the depth.

    z-lab's rule (one target layer per draft layer; ``target_layer_ids`` spread evenly from 1 to ``N - 3``) plus
    one for our index convention. Targets shallower than 5 layers spread the layers over ``1..N`` instead.

    Args:
        num_target_layers: ``N``, decoder layers of the target.
        num_context_layers: how many layers to fuse (z-lab: the draft's ``num_hidden_layers``).

    Returns:
        Sorted distinct indices in ``[1, N]``.

    Example:
        >>> default_dflash_layers(36, 5)
        (2, 10, 18, 26, 34)

    References:
        z-lab dflash ``build_target_layer_ids`` (Qwen3-4B-DFlash-b16: ``target_layer_ids [1, 9, 17, 25, 33]``).
    """
    n, k = int(num_target_layers), int(num_context_layers)
    if n < 1 or k < 1:
        raise ValueError(f"need num_target_layers >= 1 and num_context_layers >= 1, got {n} and {k}")
    if k == 1:
        return (n // 2 + 1,) if n >= 5 else (n,)
    start, end = (1, n - 3) if n >= 5 else (0, n - 1)
    ids = sorted({int(round(start + i * (end - start) / (k - 1))) + 1 for i in range(k)})
    return tuple(ids)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


# --------------------------------------------------------------------------------------------------------
# Layers (specdec.nn pieces plus qk-norm and context K/V projection)
# --------------------------------------------------------------------------------------------------------


class _QKNormAttention(Attention):
    """:class:`~specdec.nn.Attention` with optional per-head RMSNorm of queries and keys (Qwen3), and a
    key/value projection of context vectors (DFlash's K/V injection)."""

    def __init__(self, config: DecoderConfig, qk_norm: bool):
        super().__init__(config.hidden_size, config.hidden_size, config.num_attention_heads,
                         config.num_key_value_heads, config.head_dim, bias=config.qkv_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if qk_norm else nn.Identity()

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys (normed, RoPE) and values of ``x``: Shape ``[B, T, H]`` -> ``([B, h_kv, T, d], [B, h_kv, T, d])``."""
        d = self.head_dim
        k = self.k_norm(rearrange(self.k_proj(x), "b t (h d) -> b h t d", d=d))
        v = rearrange(self.v_proj(x), "b t (h d) -> b h t d", d=d)
        return apply_rotary(k, cos, sin), v

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries, keys and values of ``x`` with qk-norm before RoPE (Shapes as :meth:`Attention.project`)."""
        q = self.q_norm(rearrange(self.q_proj(x), "b t (h d) -> b h t d", d=self.head_dim))
        k, v = self.project_kv(x, cos, sin)
        return apply_rotary(q, cos, sin), k, v


class _DFlashLayer(DecoderLayer):
    """A pre-norm Llama / Qwen3 decoder layer whose attention can read extra (context) keys and values."""

    def __init__(self, config: DecoderConfig, qk_norm: bool):
        super().__init__(config)
        self.self_attn = _QKNormAttention(config, qk_norm)


class _Table(nn.Module):
    """An embedding table built without the global RNG (``weight`` Shape ``[V, r]``)."""

    def __init__(self, rows: int, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class _MarkovHead(nn.Module):
    """DSpark's low-rank Markov head: ``bias(x) = W_2 (g * W_1[x])`` with ``g = 1`` (vanilla) or a gate."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, kind: str):
        super().__init__()
        self.kind = kind
        self.markov_w1 = _Table(vocab_size, rank)
        self.markov_w2 = zero_linear(rank, vocab_size, bias=False)
        if kind == "gated":
            self.gate_proj = zero_linear(hidden_size + rank, rank, bias=True)

    def forward(self, prev_tokens: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """Logit bias of each previous token: Shape ``[..., n]`` ids (+ hidden ``[..., n, H]``) -> ``[..., n, V]``."""
        e = self.markov_w1(prev_tokens)
        if self.kind == "gated":
            if hidden is None:
                raise ValueError("a gated Markov head reads the level's hidden state: pass hidden")
            e = e * torch.sigmoid(self.gate_proj(torch.cat([hidden.to(e.dtype), e], dim=-1)))
        return self.markov_w2(e)


# --------------------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------------------


class DFlashState(NamedTuple):
    """What a DFlash / DSpark head carries between steps.

    Attributes:
        cache: each layer's context keys / values of the committed tokens, slot = position; the last slot is a
            trash slot for invalid feedback entries (written in place: a state is consumed by the next call).
        lengths: Shape ``[B]`` int64, committed tokens per row (= the root's position).
        roots: Shape ``[B]`` int64, each row's root (the next block's anchor).
        bound: host-side upper bound of ``lengths`` (when the cache must grow; no sync needed).
        since_resync: updates since ``bound`` was last re-tightened.
        mark: a re-tightening of ``bound`` under way (:func:`~specdec.graphs.mark_bound`), or ``None``.
    """

    cache: KVCache
    lengths: torch.Tensor
    roots: torch.Tensor
    bound: int
    since_resync: int
    mark: BoundMark | None = None


def _round_up(n: int, m: int = 64) -> int:
    return (n + m - 1) // m * m


# --------------------------------------------------------------------------------------------------------
# DFlash
# --------------------------------------------------------------------------------------------------------


class DFlashHead(nn.Module):
    """The DFlash block drafter: a block of mask slots after the anchor, target features as context, one forward.

    .. math::
        c_t = \\mathrm{LN}_h(W_{fc} [h^{(l_1)}_t; \\dots; h^{(l_n)}_t]) \\ (t < a), \\qquad
        K^{(i)} = [\\mathrm{RoPE}(\\mathrm{LN}_k(W^{(i)}_k c)); \\mathrm{RoPE}(\\mathrm{LN}_k(W^{(i)}_k x))],
        \\qquad q(x_{a+d}) = \\mathrm{softmax}(\\mathrm{lm\\_head}(\\mathrm{norm}(o_{s(d)})))

    with ``x`` the block's hidden states (slot 0 the anchor's embedding, the others ``mask_token_id``'s) and
    ``s(d)`` the slot of level ``d`` (see the module doc). It is a parallel head
    (:class:`~specdec.drafters.parallel.ParallelHead`): drive it with
    :class:`~specdec.drafters.parallel.ParallelDrafter` (:func:`specdec.recipes.dflash`).

    Args:
        config: a :class:`DFlashConfig` (no Markov / confidence head: those are :class:`DSparkHead`'s).
        embed_weight: the target's input embeddings (frozen, shared, not saved). Shape: ``[V, H]``.
        lm_head_weight: the target's output projection (frozen, shared, not saved). Shape: ``[V, H]``.
        lm_head_bias: its bias, if any. Shape: ``[V]``.
        seed: seeds the initialisation of fresh weights (never the global RNG).
        resync_every: updates between the re-tightenings of the cache bound (non-blocking copies of the lengths).

    Attributes:
        feature_layers, num_levels, vocab_size: the parallel-head protocol.

    Example:
        >>> head = DFlashHead.from_target(model, block_size=8)                    # doctest: +SKIP
        >>> out = specdec.generate(model, ids, drafter=specdec.recipes.dflash(head))  # doctest: +SKIP

    References:
        DFlash arXiv 2602.06036; z-lab ``DFlashDraftModel`` (layout, qk-norm, K/V injection, ``hidden_norm``).
    """

    kind = "DFlash"

    def __init__(self, config: DFlashConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 lm_head_bias: torch.Tensor | None = None, *, seed: int = 0, resync_every: int = 16):
        super().__init__()
        self._check_config(config)
        H, V = config.hidden_size, config.vocab_size
        if tuple(embed_weight.shape) != (V, H):
            raise ValueError(f"embed_weight must have shape [vocab_size={V}, hidden_size={H}], got "
                             f"{tuple(embed_weight.shape)}: the head's width must equal the target's")
        if tuple(lm_head_weight.shape) != (V, H):
            raise ValueError(f"lm_head_weight must have shape [{V}, {H}], got {tuple(lm_head_weight.shape)}")
        self.config = config
        self.resync_every = resync_every
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)
        self.register_buffer("lm_head_bias", None if lm_head_bias is None else lm_head_bias.detach(),
                             persistent=False)
        self.lm_head_fp8 = None  # a float8 copy of lm_head_weight (specdec.nn.quantize_fp8_), used when set
        self.fc = zero_linear(len(config.feature_layers) * config.feature_size, H, bias=False)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.layers = nn.ModuleList([_DFlashLayer(config.decoder, config.qk_norm) for _ in range(config.num_layers)])
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling_factor)
        self._build_extra_heads()
        self._init_weights(seed)

    # ---- construction ------------------------------------------------------------------------------------

    def _check_config(self, config: DFlashConfig) -> None:
        if config.markov_rank or config.enable_confidence_head:
            raise ValueError("this config has a Markov or confidence head: build a DSparkHead (DFlashHead is the "
                             "plain DFlash drafter)")

    def _build_extra_heads(self) -> None:
        pass

    def _init_weights(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        std = self.config.initializer_range
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, _Table):
                    module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)

    @classmethod
    def _defaults(cls) -> dict:
        return {"sample_from_anchor": False}

    @classmethod
    def from_target(cls, target, *, block_size: int = 8, num_layers: int = 1,
                    feature_layers: Sequence[int] | None = None, mask_token_id: int | None = None,
                    intermediate_size: int | None = None, qk_norm: bool = True, seed: int = 0,
                    **options) -> DFlashHead:
        """A fresh (randomly initialised) head for ``target``, shaped like its decoder layers.

        Args:
            target: an HF causal LM; its input embeddings and ``lm_head`` are shared, frozen.
            block_size: ``bs``, slots per block (anchor included).
            num_layers: decoder layers of the head.
            feature_layers: HF ``hidden_states`` indices to fuse (default :func:`default_dflash_layers` with
                ``max(num_layers, 2)`` layers, capped at the target's depth).
            mask_token_id: the mask token (default: the target's ``pad_token_id`` if set, else the last id of
                its vocabulary; any id works, the head learns what the slot means from its position).
            intermediate_size: MLP width (default: the target's).
            qk_norm: Qwen3-style qk-norm (z-lab's layout).
            seed: seeds the initialisation.
            **options: further :class:`DFlashConfig` fields (``sample_from_anchor``; DSpark: ``markov_rank``,
                ``markov_head_type``, ``enable_confidence_head``, ``confidence_head_with_markov``, ...).

        Returns:
            A head on the target's device and dtype, in eval mode.

        References:
            DFlash arXiv 2602.06036.
        """
        config = text_config(target)
        hidden, n_layers, vocab = target_dims(target)
        heads = int(config.num_attention_heads)
        layers = (tuple(feature_layers) if feature_layers is not None
                  else default_dflash_layers(n_layers, min(max(num_layers, 2), n_layers)))
        for i in layers:
            if not 0 <= i <= n_layers:
                raise ValueError(f"feature layer {i} is out of range for a target with {n_layers} layers (HF "
                                 f"hidden_states indices 0..{n_layers})")
        if mask_token_id is None:
            pad = getattr(config, "pad_token_id", None)
            mask_token_id = int(pad) if isinstance(pad, int) and 0 <= pad < vocab else vocab - 1
        sizes = dict(
            hidden_size=hidden,
            intermediate_size=int(intermediate_size or getattr(config, "intermediate_size", 4 * hidden)),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            vocab_size=vocab, feature_layers=layers, mask_token_id=int(mask_token_id), block_size=block_size,
            num_layers=num_layers, rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(config), qk_norm=qk_norm,
            initializer_range=float(getattr(config, "initializer_range", 0.02)),
        )
        sizes.update(cls._defaults())
        sizes.update(options)
        out = target.get_output_embeddings()
        emb = target.get_input_embeddings().weight
        head = cls(DFlashConfig(**sizes), emb, out.weight, getattr(out, "bias", None), seed=seed)
        return head.to(device=emb.device, dtype=emb.dtype).eval()

    # ---- the parallel-head protocol -----------------------------------------------------------------------

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """HF ``hidden_states`` indices of the target this head reads."""
        return self.config.feature_layers

    @property
    def num_levels(self) -> int:
        """``D``: levels one block drafts."""
        return self.config.num_levels

    @property
    def vocab_size(self) -> int:
        """``V``: the target's vocabulary."""
        return self.config.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the head's weights."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the head's weights."""
        return self.norm.weight.device

    # ---- building blocks ------------------------------------------------------------------------------------

    def context(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """Fuse the target's features into context vectors: ``hidden_norm(fc(cat(features)))``.

        Args:
            features: one tensor per :attr:`feature_layers`, in order. Shape: each ``[B, T, H_t]``.

        Returns:
            Shape ``[B, T, H]``.
        """
        if len(features) != len(self.feature_layers):
            raise ValueError(f"this {self.kind} head reads {len(self.feature_layers)} target layers "
                             f"{self.feature_layers}, got {len(features)} feature tensors: request exactly its "
                             f"feature_layers from the target")
        for i, f in zip(self.feature_layers, features):
            if f.shape[-1] != self.config.feature_size:
                raise ValueError(f"feature of target layer {i} has size {f.shape[-1]} but the head was made for a "
                                 f"target hidden size of {self.config.feature_size}")
        return self.hidden_norm(self.fc(torch.cat([f.to(self.dtype) for f in features], dim=-1)))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys (RoPE at ``positions``) and values of the context vectors.

        Args:
            context: Shape ``[B, T, H]`` (from :meth:`context`).
            positions: Shape ``[B, T]`` int64.

        Returns:
            Per layer ``(k, v)``, each Shape ``[B, h_kv, T, d]``.
        """
        cos, sin = self.rotary(positions, context.dtype)
        return [layer.self_attn.project_kv(context, cos, sin) for layer in self.layers]

    def block_tokens(self, anchors: torch.Tensor) -> torch.Tensor:
        """The block ``[anchor, mask, ..., mask]`` of each anchor.

        Args:
            anchors: Shape ``[...]`` int64.

        Returns:
            Shape ``[..., bs]`` int64.
        """
        mask = torch.full((*anchors.shape, self.config.block_size - 1), self.config.mask_token_id,
                          dtype=torch.long, device=anchors.device)
        return torch.cat([anchors[..., None].long(), mask], dim=-1)

    def run_layers(self, tokens: torch.Tensor, positions: torch.Tensor,
                   attend_for_layer: Callable[[int], Callable]) -> torch.Tensor:
        """Run the decoder layers on block tokens with a caller-supplied attention per layer; output normed.

        Args:
            tokens: Shape ``[B, Q]`` int64 (block slots; training stacks many blocks).
            positions: Shape ``[B, Q]`` int64, RoPE positions of the slots.
            attend_for_layer: ``i -> attend(q, k, v)`` for layer ``i`` (it prepends the context K/V).

        Returns:
            Shape ``[B, Q, H]``: ``norm`` of the last layer's output (what ``lm_head`` reads).
        """
        x = F.embedding(tokens, self.embed_weight).to(self.dtype)
        cos, sin = self.rotary(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attend_for_layer(i))
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's ``lm_head`` on normed hidden states.

        Args:
            hidden: Shape ``[..., H]``.

        Returns:
            Shape ``[..., V]``.
        """
        if self.lm_head_fp8 is not None:
            return self.lm_head_fp8(hidden)
        bias = None if self.lm_head_bias is None else self.lm_head_bias.to(hidden.dtype)
        return F.linear(hidden, self.lm_head_weight.to(hidden.dtype), bias)

    def level_hidden(self, block_hidden: torch.Tensor) -> torch.Tensor:
        """The slots that draft levels ``1..D``.

        Args:
            block_hidden: Shape ``[..., bs, H]``.

        Returns:
            Shape ``[..., D, H]``.
        """
        first = self.config.first_slot
        return block_hidden[..., first:first + self.num_levels, :]

    def blocks_hidden(self, features: Sequence[torch.Tensor], input_ids: torch.Tensor,
                      anchors: torch.Tensor) -> torch.Tensor:
        """Many blocks of each sequence in ONE forward (training): block ``j`` at anchor ``a_j`` sees the context
        at positions ``< a_j`` and its own slots only (a block-sparse mask, dense here).

        Args:
            features: the target's features of every position, one per :attr:`feature_layers`.
                Shape: each ``[B, T, H_t]``.
            input_ids: Shape ``[B, T]`` int64, the sequence (the anchors' tokens are read from it).
            anchors: Shape ``[B, A]`` int64, anchor positions in ``[1, T)``.

        Returns:
            Shape ``[B, A, D, H]``: the normed hidden state of every level of every block.
        """
        B, T = input_ids.shape
        A, bs = anchors.shape[1], self.config.block_size
        device = input_ids.device
        ctx_positions = torch.arange(T, device=device)[None].expand(B, T)
        kv = self.context_kv(self.context(features), ctx_positions)
        tokens = self.block_tokens(input_ids.gather(1, anchors)).reshape(B, A * bs)
        positions = (anchors[:, :, None] + torch.arange(bs, device=device)).reshape(B, A * bs)
        block_of = torch.arange(A * bs, device=device) // bs                                     # [Q]
        sees_context = ctx_positions[:, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]  # [B, Q, T]
        sees_block = (block_of[:, None] == block_of[None, :]).expand(B, -1, -1)                  # [B, Q, Q]
        mask = torch.cat([sees_context, sees_block], dim=-1)[:, None]

        def attend_for_layer(i: int):
            k_ctx, v_ctx = kv[i]
            return lambda q, k, v: masked_attention(q, torch.cat([k_ctx, k], 2), torch.cat([v_ctx, v], 2), mask)

        hidden = self.run_layers(tokens, positions, attend_for_layer).reshape(B, A, bs, -1)
        return self.level_hidden(hidden)

    # ---- state -----------------------------------------------------------------------------------------------

    def new_cache(self, batch_size: int, capacity: int, device=None, dtype=None) -> KVCache:
        """A zeroed context cache (``[L, B, h_kv, C, d]``).

        Args:
            batch_size, capacity: ``B``, ``C``.
            device, dtype: default: the head's.

        Returns:
            A :class:`~specdec.nn.KVCache`.
        """
        c = self.config
        return KVCache.zeros(c.num_layers, batch_size, c.num_key_value_heads, capacity, c.head_dim,
                             device=self.device if device is None else device,
                             dtype=self.dtype if dtype is None else dtype)

    @torch.no_grad()
    def start(self, feedback, *, static: bool = False, buffers: KVCache | None = None) -> DFlashState:
        """Build the state from the prompt's target pass (context K/V of every prompt token).

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback` (left padding invalid).
            static: allocate a cache meant to stay put (with headroom), for :mod:`specdec.graphs`.
            buffers: with ``static``, the cache of an earlier run (``Step.buffers``), reused when it fits.

        Returns:
            A :class:`DFlashState`.
        """
        B, M = feedback.tokens.shape
        device = feedback.tokens.device
        need = M + 2 * self.config.block_size + 1
        if not static:
            cache = self.new_cache(B, _round_up(need, 16), device)
        else:  # the previous run's cache when it fits (its graphs stay valid), else one with headroom: 256 entries
            # plus what the bound may overshoot between resyncs
            cache = static_buffers(buffers, B, need, device, lambda n: self.new_cache(B, n, device),
                                   slack=256 + self.resync_every * (self.num_levels + 1))
        state = DFlashState(cache, torch.zeros(B, dtype=torch.long, device=device), feedback.roots, 0, 0)
        return self.update(state, feedback)

    @torch.no_grad()
    def update(self, state: DFlashState, feedback) -> DFlashState:
        """Project the newly committed tokens' features into the context cache (ragged rows: ``valid``).

        Args:
            state: the previous :class:`DFlashState`.
            feedback: the committed tokens, their positions, validity and target features, and the new roots.
                Shape: tokens / positions / valid ``[B, M]``, features each ``[B, M, H_t]``, roots ``[B]``.

        Returns:
            The new :class:`DFlashState` (no host sync).
        """
        return run_step(self.absorb_step(state, feedback))

    def absorb_step(self, state: DFlashState, feedback) -> Step:
        """:meth:`update` as a :class:`~specdec.graphs.Step` (capturable; the cache grows before it, on the host).

        Args:
            state: the previous :class:`DFlashState`.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            A step: inputs ``(lengths, positions, valid, features, roots)``; ``fn`` writes the context K/V and
            returns ``(new lengths, roots)``; ``finish`` reads nothing of ``feedback`` but its width (what a caller
            folding the step into its own capture relies on, :meth:`specdec.graphs.GraphedDrafter.fold_for`); key
            ``("update",)``, or ``None`` for a prompt's width.
        """
        M = feedback.tokens.shape[1]
        if M == 0:
            return Step(fn=lambda: None, inputs=(), finish=lambda _: state._replace(roots=feedback.roots),
                        buffers=state.cache)
        bound, mark = settle_bound(state.bound, state.mark)
        state = self._ensure_capacity(state._replace(bound=bound, mark=mark), M)
        cache = state.cache

        def absorb(lengths: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                   features: tuple[torch.Tensor, ...], roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            valid = valid.bool()
            slots = torch.where(valid, positions, torch.full_like(positions, cache.capacity - 1))
            rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
            for i, (k, v) in enumerate(self.context_kv(self.context(features), positions)):
                cache.keys[i][rows, :, slots] = rearrange(k, "b h t d -> b t h d").to(cache.keys.dtype)
                cache.values[i][rows, :, slots] = rearrange(v, "b h t d -> b t h d").to(cache.values.dtype)
            return torch.maximum(lengths, torch.where(valid, positions + 1, 0).amax(1)), roots

        def finish(carry: tuple[torch.Tensor, torch.Tensor]) -> DFlashState:
            lengths, roots = carry
            bound, since, mark = state.bound + M, state.since_resync + 1, state.mark
            if since >= self.resync_every and mark is None:  # re-tightened once the copy has arrived
                mark, since = mark_bound(lengths, bound), 0
            return DFlashState(cache, lengths, roots, bound, since, mark)

        key = ("update",) if M <= self.num_levels + 1 else None
        return Step(fn=absorb, inputs=(state.lengths, feedback.positions, feedback.valid, tuple(feedback.features),
                                       feedback.roots), finish=finish, key=key, buffers=cache)

    def draft_step(self, state: DFlashState, request=None) -> Step:
        """:meth:`level_outputs` as a :class:`~specdec.graphs.Step` over the whole cache (capturable).

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: unused (the anchor and its position are the state's roots and lengths).

        Returns:
            A step: inputs ``(lengths, roots)``; ``fn`` returns ``(LevelOutput, None)``; ``finish`` returns the
            state unchanged; key ``("block",)``.
        """
        cache = state.cache

        def draft(lengths: torch.Tensor, roots: torch.Tensor) -> tuple[LevelOutput, None]:
            hidden = self.level_hidden(self.draft_hidden(DFlashState(cache, lengths, roots, 0, 0)))
            return self._outputs(hidden, roots), None

        return Step(fn=draft, inputs=(state.lengths, state.roots), finish=lambda _: state, key=("block",),
                    buffers=cache)

    def _outputs(self, hidden: torch.Tensor, roots: torch.Tensor) -> LevelOutput:
        """What a step drafts from, given the levels' hidden states ``[B, D, H]`` (DFlash: the logits alone)."""
        return LevelOutput(logits=self.logits(hidden))

    def _ensure_capacity(self, state: DFlashState, width: int) -> DFlashState:
        need = state.bound + width + self.config.block_size + 1  # the next block's slots, then the trash slot
        if need <= state.cache.capacity:
            return state
        bound, mark = settle_bound(state.bound, state.mark, wait=True)  # the true bound before growing
        state = state._replace(bound=bound, mark=mark)
        need = state.bound + width + self.config.block_size + 1
        if need <= state.cache.capacity:
            return state
        old = state.cache
        new = self.new_cache(old.keys.shape[1], _round_up(max(need, 2 * old.capacity), 16), old.keys.device,
                             old.keys.dtype)
        new.keys[:, :, :, :state.bound] = old.keys[:, :, :, :state.bound]
        new.values[:, :, :, :state.bound] = old.values[:, :, :, :state.bound]
        return state._replace(cache=new)

    # ---- drafting ----------------------------------------------------------------------------------------------

    def draft_hidden(self, state: DFlashState) -> torch.Tensor:
        """ONE forward of each row's block over its context cache.

        The block's keys and values are written into the cache at the block's own positions (slots
        ``len .. len + bs - 1``, past the row's committed entries): the next :meth:`update` overwrites those that
        get committed, and the rest stay masked (a draft sees slots ``< len`` and its own block), so no
        concatenation copies the context per layer.

        Args:
            state: from :meth:`start` / :meth:`update` (anchor = ``state.roots`` at position ``state.lengths``).

        Returns:
            Shape ``[B, bs, H]``: the normed hidden state of every slot.
        """
        cache, lengths = state.cache, state.lengths
        B, bs = lengths.shape[0], self.config.block_size
        n = cache.capacity - 1  # the whole cache but its trash slot, under the mask: the same shapes every step
        positions = lengths[:, None] + torch.arange(bs, device=lengths.device)
        sees = torch.arange(n, device=lengths.device) < (lengths + bs)[:, None]
        mask = sees[:, None, None, :].expand(B, 1, bs, n)
        return self.run_layers(self.block_tokens(state.roots), positions, cached_attention(cache, positions, mask, n))

    @torch.no_grad()
    def level_logits(self, state: DFlashState, request=None) -> torch.Tensor:
        """Draft logits of levels ``1..D`` from one block forward.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (unused: the anchor and its position
                are the state's roots and lengths, which equal ``request.roots`` / ``request.root_positions``).

        Returns:
            Shape ``[B, D, V]``.
        """
        return self.logits(self.level_hidden(self.draft_hidden(state)))

    @torch.no_grad()
    def level_outputs(self, state: DFlashState, request=None) -> LevelOutput:
        """:meth:`level_logits` as a :class:`LevelOutput` (DFlash has no confidence and no transition).

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: unused (see :meth:`level_logits`).

        Returns:
            ``LevelOutput(logits=[B, D, V])``.
        """
        return LevelOutput(logits=self.level_logits(state, request))

    @torch.no_grad()
    def draft_hidden_ref(self, features: Sequence[torch.Tensor], positions: torch.Tensor, valid: torch.Tensor,
                         roots: torch.Tensor) -> torch.Tensor:
        """Reference twin of :meth:`draft_hidden`: per row, no cache, attention written out densely.

        Args:
            features: the target's features of every committed token. Shape: each ``[B, M, H_t]``.
            positions: Shape ``[B, M]`` int64, their positions (the valid ones ``0..len-1`` in some order).
            valid: Shape ``[B, M]`` bool.
            roots: Shape ``[B]`` int64, the anchors (at position ``len``).

        Returns:
            Shape ``[B, bs, H]``.
        """
        c, bs = self.config, self.config.block_size
        out = []
        for b in range(roots.shape[0]):
            keep = valid[b].bool()
            pos = positions[b][keep][None]
            ctx = self.context([f[b][keep][None] for f in features])
            anchor_pos = int(pos.max()) + 1 if pos.numel() else 0
            block_pos = anchor_pos + torch.arange(bs, device=roots.device)[None]
            x = F.embedding(self.block_tokens(roots[b:b + 1]), self.embed_weight).to(self.dtype)
            cos_c, sin_c = self.rotary(pos, x.dtype)
            cos_b, sin_b = self.rotary(block_pos, x.dtype)
            for layer in self.layers:
                attn = layer.self_attn
                h = layer.input_layernorm(x)
                q, k, v = attn.project(h, cos_b, sin_b)
                kc, vc = attn.project_kv(ctx, cos_c, sin_c)
                k = torch.cat([kc, k], 2).repeat_interleave(c.num_attention_heads // c.num_key_value_heads, 1)
                v = torch.cat([vc, v], 2).repeat_interleave(c.num_attention_heads // c.num_key_value_heads, 1)
                weights = torch.softmax((q @ k.transpose(-1, -2)).float() / math.sqrt(c.head_dim), -1)
                x = x + attn.output(weights.to(v.dtype) @ v)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            out.append(self.norm(x))
        return torch.cat(out, 0)


# --------------------------------------------------------------------------------------------------------
# DSpark
# --------------------------------------------------------------------------------------------------------


class DSparkHead(DFlashHead):
    """DSpark: DFlash plus a low-rank Markov head (logit bias from the previous token) and a confidence head.

    .. math::
        z'_d(x) = z_d + W_2 (g_d \\odot W_1[x]), \\qquad
        c_d = \\sigma(w^\\top [h_d; W_1[x_{d-1}]] + b)

    with ``x`` the token of the node's parent (level ``d - 1``; level 0 is the anchor), ``g_d = 1`` (vanilla) or
    ``sigmoid(G [h_d; W_1[x]])`` (gated), and ``c_d`` the predicted probability that level ``d`` is accepted
    given that the levels before it were. :meth:`level_outputs` returns the base logits ``z``, the confidences of
    the greedy chain (each level's argmax of ``z'`` given the previous one) and the transition
    ``(x, d) -> W_2 (g_d W_1[x])``; drafting and gating are lossless (the draft stays a deterministic function
    of the head's outputs, and a gate only shortens it).

    Args:
        config: a :class:`DFlashConfig` (``markov_rank`` > 0 and/or ``enable_confidence_head``).
        embed_weight, lm_head_weight, lm_head_bias, seed, resync_every: as :class:`DFlashHead`.

    References:
        DSpark arXiv 2607.05147; vllm-project/speculators ``dspark`` (``markov_w1`` / ``markov_w2``, the
        confidence head's ``proj``).
    """

    kind = "DSpark"

    def _check_config(self, config: DFlashConfig) -> None:
        pass

    @classmethod
    def _defaults(cls) -> dict:
        return {"sample_from_anchor": True, "markov_rank": 64, "enable_confidence_head": True,
                "confidence_head_with_markov": True}

    def _build_extra_heads(self) -> None:
        c = self.config
        self.markov_head = (_MarkovHead(c.vocab_size, c.markov_rank, c.hidden_size, c.markov_head_type)
                            if c.markov_rank else None)
        if c.enable_confidence_head:
            width = c.hidden_size + (c.markov_rank if c.confidence_head_with_markov else 0)
            self.confidence_head = nn.Module()
            self.confidence_head.proj = zero_linear(width, 1, bias=True)
        else:
            self.confidence_head = None

    def markov_bias(self, prev_tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """The Markov head's logit bias given the previous tokens (zeros without a Markov head).

        Args:
            prev_tokens: Shape ``[..., n]`` int64, each node's parent token.
            hidden: Shape ``[..., n, H]``, the level's hidden state (read by the gated head only).

        Returns:
            Shape ``[..., n, V]``.
        """
        if self.markov_head is None:
            return torch.zeros(*prev_tokens.shape, self.vocab_size, device=prev_tokens.device, dtype=self.dtype)
        return self.markov_head(prev_tokens, hidden)

    def confidence_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """The confidence head's logits (before the sigmoid).

        Args:
            hidden: Shape ``[..., D, H]``, the levels' hidden states.
            prev_tokens: Shape ``[..., D]`` int64, each level's previous token (read with
                ``confidence_head_with_markov``).

        Returns:
            Shape ``[..., D]``.
        """
        if self.confidence_head is None:
            raise ValueError("this DSpark head has no confidence head (enable_confidence_head=False)")
        x = hidden
        if self.config.confidence_head_with_markov:
            x = torch.cat([hidden, self.markov_head.markov_w1(prev_tokens).to(hidden.dtype)], dim=-1)
        return self.confidence_head.proj(x)[..., 0]

    @torch.no_grad()
    def level_outputs(self, state: DFlashState, request=None) -> LevelOutput:
        """One block forward: base logits, the transition, and the greedy chain's confidences.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: unused (see :meth:`DFlashHead.level_logits`).

        Returns:
            ``LevelOutput(logits [B, D, V], confidence [B, D] or None, transition or None)``.
        """
        return self._outputs(self.level_hidden(self.draft_hidden(state)), state.roots)

    def _outputs(self, hidden: torch.Tensor, roots: torch.Tensor) -> LevelOutput:
        """Base logits, the transition and the greedy chain's confidences from the levels' hidden ``[B, D, H]``."""
        logits = self.logits(hidden)
        transition = None
        if self.markov_head is not None:
            def transition(prev_tokens: torch.Tensor, level: int) -> torch.Tensor:
                h = hidden[:, level - 1, None].expand(-1, prev_tokens.shape[1], -1)
                return self.markov_bias(prev_tokens, h).to(logits.dtype)
        confidence = None
        if self.confidence_head is not None:
            prev = self.chain_prev_tokens(logits, roots, transition)
            confidence = torch.sigmoid(self.confidence_logits(hidden, prev).float())
        return LevelOutput(logits=logits, confidence=confidence, transition=transition)

    @torch.no_grad()
    def level_logits(self, state: DFlashState, request=None) -> torch.Tensor:
        """Levels ``1..D``'s logits along the greedy chain: level ``d``'s base logits plus the Markov bias of the
        chain's level ``d - 1`` token (for drafters that read no transition; a chain of their top-1s is exactly
        the sequential argmax :meth:`level_outputs` describes).

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: unused.

        Returns:
            Shape ``[B, D, V]``.
        """
        out = self.level_outputs(state, request)
        if out.transition is None:
            return out.logits
        prev = self.chain_prev_tokens(out.logits, state.roots, out.transition)
        bias = torch.stack([out.transition(prev[:, d - 1, None], d)[:, 0] for d in range(1, out.logits.shape[1] + 1)],
                           1)
        return out.logits + bias

    @staticmethod
    def chain_prev_tokens(logits: torch.Tensor, roots: torch.Tensor, transition=None) -> torch.Tensor:
        """The greedy chain's previous token of each level: the root, then each level's argmax of its biased
        logits given the previous one.

        Args:
            logits: Shape ``[B, D, V]``, base logits.
            roots: Shape ``[B]`` int64.
            transition: ``(prev [B, n], level) -> [B, n, V]`` or ``None``.

        Returns:
            Shape ``[B, D]`` int64: level ``d``'s previous token (level ``d - 1``'s draft; the root for ``d = 1``).
        """
        prev = [roots.long()]
        for d in range(1, logits.shape[1]):
            z = logits[:, d - 1]
            if transition is not None:
                z = z + transition(prev[-1][:, None], d)[:, 0]
            prev.append(z.argmax(-1))
        return torch.stack(prev, 1)
