"""Medusa heads: ``D`` small residual networks on the target's last hidden state, one per future position.

Head ``k`` (0-based) reads the target's final, normed hidden state ``f_t`` at position ``t`` (the vector the
target feeds to its own ``lm_head``, which predicts ``t + 1``) and predicts the token at ``t + k + 2``:

.. math::
    h^{(k)}_0 = f_t, \\qquad h^{(k)}_{l+1} = h^{(k)}_l + \\mathrm{SiLU}(W^{(k)}_l h^{(k)}_l + b^{(k)}_l),
    \\qquad p^{(k)}(x_{t+k+2}) = \\mathrm{softmax}(U^{(k)} h^{(k)}_L)

Two layouts of the vocabulary projection ``U``:

- **Medusa-1** (the authors' first release, ``FasterDecoding/medusa-vicuna-*``): every head owns ``U^{(k)}``
  (``[V, H]``, no bias), initialised as a copy of the target's ``lm_head``.
- **shared** (``shared_lm_head=True``; the authors' "v2" heads after their PR #97, vLLM's ``original_lm_head``):
  every head reuses the target's own ``lm_head`` (frozen, not saved), so a head costs ``H x H`` per layer only.

The residual blocks start at zero (weights and biases), so a fresh head is the identity followed by its
projection. All heads run in one batched contraction (stacked weights ``[D, L, H, H]``); :meth:`MedusaHead.
forward_ref` is the per-head loop of the same signature, kept as the reference.

A Medusa head is a *parallel head* (:class:`specdec.drafters.parallel.ParallelHead`): one call gives every
level's distribution from the feature of the last committed token, ``level_logits(state) -> [B, D, V]``.

References:
    Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads", ICML 2024,
    arXiv 2401.10774, https://arxiv.org/abs/2401.10774 (Sec. 2.1.1, Medusa heads; Sec. 2.3, training).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MedusaConfig", "MedusaHead", "medusa_target_dims"]


@dataclass(frozen=True)
class MedusaConfig:
    """Sizes of a set of Medusa heads.

    Attributes:
        hidden_size: ``H``, the target's hidden size (heads read and keep this width).
        vocab_size: ``V``, the target's vocabulary (rows of its ``lm_head``).
        feature_layer: the HF ``hidden_states`` index the heads read: the target's ``num_hidden_layers`` (the
            output after the final norm, which feeds ``lm_head``).
        num_heads: ``D``, heads; head ``k`` predicts the token ``k + 2`` positions after the feature.
        num_layers: ``L``, residual blocks per head (the published heads use 1).
        shared_lm_head: heads reuse the target's ``lm_head`` instead of owning one each.
        bias: the residual blocks' linear layers have a bias (the authors' heads do; vLLM's
            ``medusa_fc_bias`` defaults to False).
    """

    hidden_size: int
    vocab_size: int
    feature_layer: int
    num_heads: int = 5
    num_layers: int = 1
    shared_lm_head: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MedusaConfig.{name} must be an int >= 1, got {value!r}")
        if self.feature_layer < 0:
            raise ValueError(f"MedusaConfig.feature_layer must be an HF hidden_states index >= 0 (the target's "
                             f"num_hidden_layers for the final normed output), got {self.feature_layer}")


def medusa_target_dims(target) -> tuple[int, int, int]:
    """The sizes of an HF causal LM a Medusa head must match.

    Args:
        target: an HF causal LM.

    Returns:
        ``(hidden_size, num_hidden_layers, vocab_size)``; the vocabulary is the number of rows of the output
        embedding (``lm_head``), which Medusa's projections replace or share.
    """
    config = target.config
    getter = getattr(config, "get_text_config", None)
    config = getter() if callable(getter) else config
    out = target.get_output_embeddings()
    if out is None:
        raise ValueError(f"{type(target).__name__} has no output embedding (lm_head): Medusa heads need a causal "
                         f"LM with one (load it with AutoModelForCausalLM)")
    return int(config.hidden_size), int(config.num_hidden_layers), int(out.weight.shape[0])


class MedusaHead(nn.Module):
    """``D`` Medusa heads: per head ``L`` residual blocks ``x + SiLU(W x + b)`` and a vocabulary projection.

    Args:
        config: a :class:`MedusaConfig`.
        lm_head_weight: the target's ``lm_head`` weight. With ``shared_lm_head`` it is held as a frozen
            non-persistent buffer sharing the target's storage (never saved); otherwise every head's own
            projection starts as a copy of it (the authors' initialisation). ``None``: own projections start at
            zero (a loader overwrites them).
            Shape: ``[V, H]``.
        lm_head_bias: the target's ``lm_head`` bias, if it has one (used with ``shared_lm_head``).
            Shape: ``[V]``.

    Attributes:
        feature_layers: ``(config.feature_layer,)``, the target layer the drafter must capture.
        num_levels: ``D``: levels of a draft tree one call predicts.
        vocab_size: ``V``.

    Example:
        >>> head = MedusaHead.from_target(model, num_heads=4)          # doctest: +SKIP
        >>> logits = head(features)                                     # [B, T, 4, V]  # doctest: +SKIP

    References:
        Medusa arXiv 2401.10774 (Sec. 2.1.1; ``ResBlock`` zero-initialised; per-head ``lm_head`` copied from the
        base model in the first release; shared ``lm_head`` in the authors' PR #97).
    """

    def __init__(self, config: MedusaConfig, lm_head_weight: torch.Tensor | None = None,
                 lm_head_bias: torch.Tensor | None = None):
        super().__init__()
        D, L, H, V = config.num_heads, config.num_layers, config.hidden_size, config.vocab_size
        if lm_head_weight is not None and tuple(lm_head_weight.shape) != (V, H):
            raise ValueError(f"lm_head_weight must have shape [vocab_size={V}, hidden_size={H}], got "
                             f"{tuple(lm_head_weight.shape)}")
        if config.shared_lm_head and lm_head_weight is None:
            raise ValueError("a head with shared_lm_head=True needs the target's lm_head weight: build it with "
                             "MedusaHead.from_target(target, shared_lm_head=True)")
        self.config = config
        dtype = lm_head_weight.dtype if lm_head_weight is not None else torch.float32
        device = lm_head_weight.device if lm_head_weight is not None else None
        self.block_weight = nn.Parameter(torch.zeros(D, L, H, H, dtype=dtype, device=device))
        self.block_bias = nn.Parameter(torch.zeros(D, L, H, dtype=dtype, device=device)) if config.bias else None
        if config.shared_lm_head:
            self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)
            self.register_buffer("lm_head_bias", None if lm_head_bias is None else lm_head_bias.detach(),
                                 persistent=False)
        else:
            init = (lm_head_weight.detach()[None].expand(D, V, H).clone() if lm_head_weight is not None
                    else torch.zeros(D, V, H, dtype=dtype, device=device))
            self.lm_head_weight = nn.Parameter(init)
            self.lm_head_bias = None

    # ---- construction ------------------------------------------------------------------------------------

    @classmethod
    def from_target(cls, target, *, num_heads: int = 5, num_layers: int = 1, shared_lm_head: bool = False,
                    bias: bool = True) -> MedusaHead:
        """Fresh heads for ``target``: residual blocks at zero, projections copied from (or sharing) its lm_head.

        A fresh head therefore predicts, at every level, the target's own next-token distribution at the feature's
        position; training moves head ``k`` to the token ``k + 2`` positions ahead.

        Args:
            target: an HF causal LM.
            num_heads: ``D``.
            num_layers: residual blocks per head.
            shared_lm_head: reuse the target's ``lm_head`` (the shared layout) instead of one copy per head.
            bias: biases in the residual blocks.

        Returns:
            A :class:`MedusaHead` on the target's device and in its dtype (eval mode).

        References:
            Medusa arXiv 2401.10774 (initialisation: zero blocks, projections from the base ``lm_head``).
        """
        hidden, layers, vocab = medusa_target_dims(target)
        out = target.get_output_embeddings()
        config = MedusaConfig(hidden_size=hidden, vocab_size=vocab, feature_layer=layers, num_heads=num_heads,
                              num_layers=num_layers, shared_lm_head=shared_lm_head, bias=bias)
        return cls(config, out.weight, getattr(out, "bias", None)).eval()

    # ---- introspection -----------------------------------------------------------------------------------

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """HF ``hidden_states`` indices of the target the heads read (one: the final normed output)."""
        return (self.config.feature_layer,)

    @property
    def num_levels(self) -> int:
        """``D``: tree levels one call predicts (= number of heads)."""
        return self.config.num_heads

    @property
    def vocab_size(self) -> int:
        """``V``: the target vocabulary."""
        return self.config.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the heads' weights."""
        return self.block_weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the heads' weights."""
        return self.block_weight.device

    def check_features(self, features: torch.Tensor) -> None:
        """Refuse a feature of the wrong width (a head made for another target).

        Args:
            features: Shape ``[..., H]``.
        """
        if features.shape[-1] != self.config.hidden_size:
            raise ValueError(f"the Medusa heads were made for a target hidden size of {self.config.hidden_size} but "
                             f"got features of size {features.shape[-1]}: use heads trained for this target")

    # ---- forward -----------------------------------------------------------------------------------------

    def hidden(self, features: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """Every head's residual blocks on the same features (all heads in one batched contraction per layer).

        .. math:: h^{(k)}_{l+1} = h^{(k)}_l + \\mathrm{SiLU}(W^{(k)}_l h^{(k)}_l + b^{(k)}_l), \\quad h^{(k)}_0 = f

        Args:
            features: the target's final normed hidden states.
                Shape: ``[..., H]``.
            heads: run only these heads (default all).

        Returns:
            Shape ``[..., D', H]`` with ``D'`` the heads run.
        """
        self.check_features(features)
        heads = heads or slice(None)
        weight = self.block_weight[heads]                                   # [D', L, H, H]
        bias = self.block_bias[heads] if self.block_bias is not None else None
        x = features.to(weight.dtype)[..., None, :].expand(*features.shape[:-1], weight.shape[0], features.shape[-1])
        for layer in range(self.config.num_layers):
            y = torch.einsum("...dh,dgh->...dg", x, weight[:, layer])
            if bias is not None:
                y = y + bias[:, layer]
            x = x + F.silu(y)
        return x

    def project(self, hidden: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """Vocabulary logits of each head's hidden state (own projections, or the shared target ``lm_head``).

        Args:
            hidden: output of :meth:`hidden` for the same ``heads``.
                Shape: ``[..., D', H]``.
            heads: the heads ``hidden`` holds (default all).

        Returns:
            Shape ``[..., D', V]``.
        """
        if self.config.shared_lm_head:
            return F.linear(hidden, self.lm_head_weight.to(hidden.dtype),
                            None if self.lm_head_bias is None else self.lm_head_bias.to(hidden.dtype))
        weight = self.lm_head_weight[heads or slice(None)]                  # [D', V, H]
        return torch.einsum("...dh,dvh->...dv", hidden, weight.to(hidden.dtype))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits of every head at every feature.

        Args:
            features: the target's final normed hidden states at positions ``t``.
                Shape: ``[..., H]``.

        Returns:
            Shape ``[..., D, V]``: entry ``k`` is head ``k``'s logits for the token at ``t + k + 2``.
        """
        return self.project(self.hidden(features))

    def head_logits(self, features: torch.Tensor, k: int) -> torch.Tensor:
        """Logits of head ``k`` alone (training computes one head at a time to bound memory).

        Args:
            features: Shape ``[..., H]``.
            k: the head, ``0 <= k < D``.

        Returns:
            Shape ``[..., V]``.
        """
        if not 0 <= k < self.config.num_heads:
            raise ValueError(f"head index {k} is out of range for {self.config.num_heads} heads")
        one = slice(k, k + 1)
        return self.project(self.hidden(features, one), one)[..., 0, :]

    def forward_ref(self, features: torch.Tensor) -> torch.Tensor:
        """Reference twin of :meth:`forward`: a plain loop over heads and layers with ``F.linear``.

        Args:
            features: Shape ``[..., H]``.

        Returns:
            Shape ``[..., D, V]``.
        """
        self.check_features(features)
        out = []
        for k in range(self.config.num_heads):
            x = features.to(self.dtype)
            for layer in range(self.config.num_layers):
                b = None if self.block_bias is None else self.block_bias[k, layer]
                x = x + F.silu(F.linear(x, self.block_weight[k, layer], b))
            if self.config.shared_lm_head:
                out.append(F.linear(x, self.lm_head_weight.to(x.dtype),
                                    None if self.lm_head_bias is None else self.lm_head_bias.to(x.dtype)))
            else:
                out.append(F.linear(x, self.lm_head_weight[k]))
        return torch.stack(out, dim=-2)

    # ---- the parallel-head protocol ----------------------------------------------------------------------

    def level_logits(self, state, request=None) -> torch.Tensor:
        """Every level's draft logits from the feature of the last committed token (one call, no context).

        Args:
            state: the drafter's default state for stateless heads: a tuple with one tensor, the target's
                feature at the last committed token of each row.
                Shape: ``([B, H],)``.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (unused: Medusa's drafts do not depend
                on the root token).

        Returns:
            Shape ``[B, D, V]``: level ``d`` (1-based) is row ``d - 1``.
        """
        (features,) = state
        return self(features)
