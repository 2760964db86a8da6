"""The one place that talks to HuggingFace causal LMs.

:class:`ModelAdapter` runs any HF causal LM (target or draft model) on a tree of tokens over its KV cache,
with a custom 4-D attention mask and explicit positions, returns logits and the requested hidden-state layers,
and compacts the cache so that each row keeps only its accepted path (rows accept different lengths).

Cache layout per row (``L = Lc + P`` slots)::

    [ committed slots (Lc, some invalid: left padding, holes) | pending slots (P) ]

*Committed* slots hold tokens that are part of the sequence; ``CacheState.committed_valid`` says which of
them are real. *Pending* slots were written by :meth:`ModelAdapter.forward` calls since the last
:meth:`ModelAdapter.commit`: tree nodes whose fate is not decided yet. Each pending node sees the valid
committed slots, its pending ancestors and itself; :meth:`ModelAdapter.commit` keeps a chosen path of
pending slots per row (moved to the front of the pending region) and drops the rest.

Works with transformers 5.17 through 5.24+ (the cache keyword is ``cache`` from 5.24 and
``past_key_values`` before; the adapter inspects the signature once).
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
from torch import nn

from .masks import to_aligned_additive_mask
from .nn.attention import masked_sdpa_kernel
from .trees import ancestor_matrix

__all__ = ["CacheState", "ForwardOutput", "ModelAdapter", "SUPPORTED_ATTENTION"]

SUPPORTED_ATTENTION = ("sdpa", "eager")


class CacheState(NamedTuple):
    """KV cache of one model plus the bookkeeping that makes it ragged-row safe.

    Attributes:
        cache: the HF ``DynamicCache`` (its tensors are replaced, never shared between states).
        committed_valid: Shape ``[B, Lc]`` bool, which committed slots hold real tokens.
        lengths: Shape ``[B]`` int64, committed tokens per row (= position id of the next token).
        pending_parents: Shape ``[B, P]`` int64, parent of each pending slot as a pending index, ``-1`` when
            the slot sits directly on the committed prefix (or is absent).
        pending_present: Shape ``[B, P]`` bool, which pending slots are real nodes.
    """

    cache: object
    committed_valid: torch.Tensor
    lengths: torch.Tensor
    pending_parents: torch.Tensor
    pending_present: torch.Tensor

    @property
    def num_pending(self) -> int:
        """``P``: slots written since the last commit."""
        return self.pending_parents.shape[1]


class ForwardOutput(NamedTuple):
    """What one forward returns.

    Attributes:
        logits: Shape ``[B, M, V]``, the model's logits at each input token.
        features: one ``[B, M, H]`` tensor per requested hidden-state layer (HF ``hidden_states`` index).
    """

    logits: torch.Tensor
    features: tuple[torch.Tensor, ...]


def _new_cache():
    from transformers import DynamicCache

    # No config: plain full-attention layers. A sliding-window model is checked in __init__ instead.
    return DynamicCache()


class ModelAdapter:
    """Run an HF causal LM on trees of tokens over a ragged, compactable KV cache.

    Args:
        model: any ``transformers`` causal LM whose attention takes a custom 4-D mask (``sdpa`` or
            ``eager`` attention implementation).
        feature_layers: HF ``hidden_states`` indices to return (``i`` = input of decoder layer ``i``,
            ``num_hidden_layers`` = final output after the last norm). Empty for none.

    Raises:
        ValueError: the model's attention implementation cannot take a custom 4-D mask, or a feature layer
            is out of range.

    Example:
        >>> ad = ModelAdapter(model)                                   # doctest: +SKIP
        >>> out, state = ad.prefill(input_ids, attention_mask)         # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, feature_layers: tuple[int, ...] = ()):
        self.model = model
        config = model.config
        impl = getattr(config, "_attn_implementation", None) or "eager"
        if impl not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"{type(model).__name__} uses attn_implementation={impl!r}, which cannot take the custom 4-D "
                f"tree-attention mask speculative decoding needs. Load it with "
                f"attn_implementation='sdpa' (or 'eager'), or call model.set_attn_implementation('sdpa')."
            )
        num_layers = getattr(config, "num_hidden_layers", None)
        for layer in feature_layers:
            if num_layers is not None and not (0 <= layer <= num_layers):
                raise ValueError(
                    f"feature layer {layer} is out of range for a model with {num_layers} layers: use an HF "
                    f"hidden_states index in [0, {num_layers}] ({num_layers} = final normed output)."
                )
        self.feature_layers = tuple(feature_layers)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.sliding_window = getattr(config, "sliding_window", None) if getattr(
            config, "use_sliding_window", True) else None
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params

    # ------------------------------------------------------------------ helpers
    def _check_length(self, max_position: int) -> None:
        if self.max_positions is not None and max_position >= self.max_positions:
            raise ValueError(
                f"position {max_position} exceeds the model's max_position_embeddings={self.max_positions}: "
                f"shorten the prompt or lower max_new_tokens / the number of drafts."
            )
        if self.sliding_window is not None and max_position >= self.sliding_window:
            raise ValueError(
                f"the sequence reaches position {max_position}, past the model's sliding_window="
                f"{self.sliding_window}; the tree mask implements full attention, so the output would differ "
                f"from the model's. Keep prompt + new tokens under the window."
            )

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """Bool visibility ``[B, M, L]`` -> an additive mask ``[B, 1, M, L]`` (both sdpa and eager take it).

        Given a bool mask, SDPA would convert it to an additive one in every layer (3 more kernels per layer on
        CUDA); converting once per forward, into row-aligned storage, spares that and SDPA's per-call padding.
        """
        return to_aligned_additive_mask(visible[:, None], self.model.dtype)

    def _run(self, tokens, mask, positions, cache, logits_to_keep: int = 0) -> ForwardOutput:
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self.feature_layers:
            kwargs["output_hidden_states"] = True
        if logits_to_keep and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        if tokens.is_cuda:
            with masked_sdpa_kernel():
                out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kwargs)
        else:
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kwargs)
        feats = tuple(out.hidden_states[i] for i in self.feature_layers) if self.feature_layers else ()
        return ForwardOutput(out.logits, feats)

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *, last_logits_only: bool = True) -> tuple[ForwardOutput, CacheState]:
        """Run the prompt and commit it.

        Args:
            input_ids: Shape ``[B, T]``, left-padded prompts.
            attention_mask: Shape ``[B, T]``, 1 for real tokens (default: all real).
            last_logits_only: return logits for the last position only (``[B, 1, V]``).

        Returns:
            ``(ForwardOutput, CacheState)``; features cover all ``T`` positions.
        """
        B, T = input_ids.shape
        device = input_ids.device
        valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        positions = (valid.long().cumsum(1) - 1).clamp_(min=0)
        self._check_length(T - 1)
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril_()
        eye = torch.eye(T, dtype=torch.bool, device=device)
        # A padding token sees only itself, so no attention row is empty (an empty row is NaN in sdpa).
        visible = (causal & valid[:, None, :] & valid[:, :, None]) | eye
        cache = _new_cache()
        out = self._run(input_ids, self._mask(visible), positions, cache, logits_to_keep=1 if last_logits_only else 0)
        if last_logits_only and out.logits.shape[1] != 1:
            out = ForwardOutput(out.logits[:, -1:], out.features)
        empty = torch.empty(B, 0, dtype=torch.long, device=device)
        state = CacheState(cache, valid, valid.sum(1), empty, empty.bool())
        return out, state

    @torch.no_grad()
    def forward(self, state: CacheState, tokens: torch.Tensor, parents: torch.Tensor,
                positions: torch.Tensor, present: torch.Tensor | None = None) -> tuple[ForwardOutput, CacheState]:
        """Run new pending nodes; each sees the valid committed slots, its pending ancestors and itself.

        Args:
            state: the cache state.
            tokens: Shape ``[B, M]``, the new nodes' tokens.
            parents: Shape ``[B, M]`` int64, parent of each new node as an index into the pending region
                (``P`` existing pending slots, then these ``M``), or ``-1`` for a node that sits directly on
                the committed prefix.
            positions: Shape ``[B, M]`` int64, position ids.
            present: Shape ``[B, M]`` bool, absent nodes (padding) see only themselves and are never kept.

        Returns:
            ``(ForwardOutput, state)`` with ``M`` more pending slots.
        """
        B, M = tokens.shape
        if present is None:
            present = torch.ones_like(tokens, dtype=torch.bool)
        all_parents = torch.cat([state.pending_parents, parents], 1)
        all_present = torch.cat([state.pending_present, present], 1)
        # Rows of the new nodes in the ancestor matrix of the whole pending forest.
        # An absent node is nobody's ancestor and sees only itself, so no presence masking is needed here.
        anc = ancestor_matrix(all_parents)[:, -M:]
        prefix = state.committed_valid[:, None, :] & present[:, :, None]
        visible = torch.cat([prefix.expand(B, M, -1), anc], 2)
        out = self._run(tokens, self._mask(visible), positions, state.cache)
        return out, state._replace(pending_parents=all_parents, pending_present=all_present)

    @torch.no_grad()
    def commit(self, state: CacheState, keep: torch.Tensor, counts: torch.Tensor) -> CacheState:
        """Keep, per row, a path of pending slots as committed tokens and drop every other pending slot.

        Args:
            state: a state with ``P`` pending slots.
            keep: Shape ``[B, A]`` int64, pending indices to keep, in sequence order, ``-1`` padded; ``A``
                should be the largest count (the cache grows by ``A`` slots).
            counts: Shape ``[B]`` int64, how many entries of ``keep`` are real per row.

        Returns:
            The state with no pending slots and ``Lc + A`` committed slots.
        """
        P = state.num_pending
        B, A = keep.shape
        Lc = state.committed_valid.shape[1]
        device = keep.device
        if A:
            idx = keep.clamp(min=0) + Lc
            ar = torch.arange(A, device=device)[None, :]
            # Fast path (one host sync): every row keeps a prefix of its pending slots, e.g. a chain.
            identity = A <= P and bool(((keep == ar) | (ar >= counts[:, None])).all())
            for layer in state.cache.layers:
                k, v = layer.keys, layer.values
                if k is None:
                    continue
                if not identity:
                    gi = idx[:, None, :, None].expand(B, k.shape[1], A, k.shape[3])
                    k_sel, v_sel = k.gather(2, gi), v.gather(2, gi)
                    k = torch.cat([k[:, :, :Lc], k_sel], 2)
                    v = torch.cat([v[:, :, :Lc], v_sel], 2)
                else:
                    k, v = k[:, :, : Lc + A], v[:, :, : Lc + A]
                layer.keys, layer.values = k, v
        else:
            for layer in state.cache.layers:
                if layer.keys is not None:
                    layer.keys, layer.values = layer.keys[:, :, :Lc], layer.values[:, :, :Lc]
        new_valid = torch.arange(A, device=device)[None, :] < counts[:, None]
        empty = torch.empty(B, 0, dtype=torch.long, device=device)
        return CacheState(state.cache, torch.cat([state.committed_valid, new_valid], 1),
                          state.lengths + counts, empty, empty.bool())

    def check_positions(self, max_position: int) -> None:
        """Raise a clear error if ``max_position`` is past what the model supports."""
        self._check_length(max_position)
