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

Two kinds of forward:

- :meth:`ModelAdapter.prefill` and :meth:`ModelAdapter.decode` (one token per row, kept at once) hand HF the
  2-D padding mask (``None`` when no slot is invalid), exactly as HF's own ``generate`` does, so HF builds its
  own mask and the same attention kernel runs: plain decoding gives HF's tokens bit for bit, in bf16 too.
- :meth:`ModelAdapter.forward` runs a tree under a custom 4-D mask (the only way to verify several drafts in
  one pass); :meth:`ModelAdapter.commit` then keeps the accepted path.

**States are consumed.** The HF cache is updated in place (copying it every step would cost more than the
step), so ``prefill``/``decode``/``forward``/``commit`` each consume the :class:`CacheState` they are given
and return its successor. Passing a consumed state again raises :class:`ConsumedStateError` (a cheap flag
check), instead of silently reading a cache that has moved on.

Works with transformers 5.17 through 5.24+ (the cache keyword is ``cache`` from 5.24 and
``past_key_values`` before; the adapter inspects the signature once).
"""
from __future__ import annotations

import inspect
from typing import NamedTuple

import torch
from torch import nn

from .kernels import compact_kv, tree_mask
from .masks import to_aligned_additive_mask
from .nn.attention import masked_sdpa_kernel

__all__ = ["CacheState", "ConsumedStateError", "ForwardOutput", "ModelAdapter", "SUPPORTED_ATTENTION",
           "UnsupportedModelError", "check_causal_lm"]

SUPPORTED_ATTENTION = ("sdpa", "eager")


class ConsumedStateError(RuntimeError):
    """A :class:`CacheState` was used after an adapter call consumed it (the HF cache has moved on since)."""


class UnsupportedModelError(ValueError):
    """The model cannot be decoded left to right by specdec (not a causal LM with logits, or an attention
    implementation that takes no custom mask); the message says what to load instead."""


class _Ticket:
    """Marks one :class:`CacheState` as the live one for its HF cache; spent when a call consumes the state."""

    __slots__ = ("spent_by",)

    def __init__(self) -> None:
        self.spent_by: str | None = None


class CacheState(NamedTuple):
    """KV cache of one model plus the bookkeeping that makes it ragged-row safe.

    A state is **consumed** by the adapter call it is passed to (the HF cache is updated in place); use the
    state that call returns. Reusing a consumed state raises :class:`ConsumedStateError`.

    Attributes:
        cache: the HF ``DynamicCache``, updated in place by ``decode``/``forward``/``commit``.
        committed_valid: Shape ``[B, Lc]`` bool, which committed slots hold real tokens.
        lengths: Shape ``[B]`` int64, committed tokens per row (= position id of the next token).
        pending_parents: Shape ``[B, P]`` int64, parent of each pending slot as a pending index, ``-1`` when
            the slot sits directly on the committed prefix (or is absent).
        pending_present: Shape ``[B, P]`` bool, which pending slots are real nodes.
        all_valid: host flag, every committed slot is valid (no padding, no holes): a one-token decode then
            needs no mask at all, as in HF.
        ticket: the consumption guard (set by the adapter; ``None`` leaves a hand-built state unguarded).
    """

    cache: object
    committed_valid: torch.Tensor
    lengths: torch.Tensor
    pending_parents: torch.Tensor
    pending_present: torch.Tensor
    all_valid: bool = False
    ticket: _Ticket | None = None

    @property
    def num_pending(self) -> int:
        """``P``: slots written since the last commit."""
        return self.pending_parents.shape[1]


def _consume(state: CacheState, call: str) -> None:
    ticket = state.ticket
    if ticket is None:
        return
    if ticket.spent_by is not None:
        raise ConsumedStateError(
            f"this CacheState was already consumed by {ticket.spent_by}(): the HF cache is updated in place, so "
            f"an older state no longer describes it. Pass the state that {ticket.spent_by}() returned to {call}()."
        )
    ticket.spent_by = call


class ForwardOutput(NamedTuple):
    """What one forward returns.

    Attributes:
        logits: Shape ``[B, M, V]``, the model's logits at each input token.
        features: one ``[B, M, H]`` tensor per requested hidden-state layer (HF ``hidden_states`` index).
    """

    logits: torch.Tensor
    features: tuple[torch.Tensor, ...]


def check_causal_lm(model: nn.Module, role: str = "target") -> None:
    """Refuse, up front, a model that cannot decode left to right with logits.

    Checks, in order: not an encoder-decoder (``config.is_encoder_decoder``: T5, BART, ...); an LM head that
    produces logits (``get_output_embeddings()``; ``AutoModel`` returns a bare decoder); causal attention (the
    config's ``is_causal`` is not ``False`` and not every attention module says ``is_causal=False``: BERT-style
    masked LMs attend both ways).

    Args:
        model: the model to check.
        role: how the error names it (``"target"``, ``"draft model"``).

    Raises:
        UnsupportedModelError: naming the model class, the problem and what to load instead.
    """
    name = type(model).__name__
    config = getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(f"the {role} ({name}) has no .config: pass a transformers causal LM, e.g. "
                                    f"AutoModelForCausalLM.from_pretrained(...)")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"the {role} {name} is an encoder-decoder model (config.is_encoder_decoder=True, e.g. T5/BART): specdec "
            f"decodes decoder-only causal LMs. Load one with AutoModelForCausalLM.from_pretrained(...).")
    get_head = getattr(model, "get_output_embeddings", None)
    if get_head is None or get_head() is None:
        raise UnsupportedModelError(
            f"the {role} {name} has no LM head: it returns hidden states, not logits (AutoModel loads the bare "
            f"decoder). Load it with AutoModelForCausalLM.from_pretrained(...) instead.")
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    if getattr(config, "is_causal", True) is False or (flags and not any(flags)):
        raise UnsupportedModelError(
            f"the {role} {name} attends bidirectionally (a masked LM or encoder, e.g. BertForMaskedLM), so it cannot "
            f"decode left to right. Load a causal LM with AutoModelForCausalLM.from_pretrained(...) (BERT-style "
            f"LM heads need config.is_decoder=True).")


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
        role: how errors name the model (``"target"``, ``"draft model"``).

    Raises:
        UnsupportedModelError: not a causal LM with logits (:func:`check_causal_lm`), or an attention
            implementation that cannot take a custom 4-D mask.
        ValueError: a feature layer is out of range.

    Example:
        >>> ad = ModelAdapter(model)                                   # doctest: +SKIP
        >>> out, state = ad.prefill(input_ids, attention_mask)         # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, feature_layers: tuple[int, ...] = (), *, role: str = "target"):
        check_causal_lm(model, role)
        self.model = model
        config = model.config
        impl = getattr(config, "_attn_implementation", None) or "eager"
        if impl not in SUPPORTED_ATTENTION:
            raise UnsupportedModelError(
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
        head = model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        #: ``V``: the width of the model's logits (its output embedding rows).
        self.vocab_size = int(weight.shape[0]) if weight is not None else getattr(config, "vocab_size", None)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.sliding_window = getattr(config, "sliding_window", None) if getattr(
            config, "use_sliding_window", True) else None
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._ones_key, self._ones_col = None, None

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

    def _run(self, tokens, mask, positions, cache, *, logits_to_keep: int = 0, tree: bool = False) -> ForwardOutput:
        """One model call. ``tree``: a custom 4-D mask on CUDA, kept off the cuDNN SDPA backend (see
        ``masked_sdpa_kernel``); otherwise HF gets a 2-D mask (or ``None``) and runs exactly as in its ``generate``."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if self.feature_layers:
            kwargs["output_hidden_states"] = True
        if logits_to_keep and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        if tree and tokens.is_cuda:
            with masked_sdpa_kernel():
                out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kwargs)
        else:
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, **kwargs)
        feats = tuple(out.hidden_states[i] for i in self.feature_layers) if self.feature_layers else ()
        return ForwardOutput(logits=out.logits, features=feats)

    # ------------------------------------------------------------------ API
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *, last_logits_only: bool = True) -> tuple[ForwardOutput, CacheState]:
        """Run the prompt and commit it, as HF's ``generate`` runs its prefill.

        HF gets the 2-D padding mask (``None`` without padding) and builds its own causal mask, so the same
        attention kernel runs as in HF's ``generate`` and the cache holds the same values.

        Args:
            input_ids: Shape ``[B, T]``, left-padded prompts.
            attention_mask: Shape ``[B, T]``, 1 for real tokens (default: all real).
            last_logits_only: return logits for the last position only (``[B, 1, V]``).

        Returns:
            ``(ForwardOutput, CacheState)``; features cover all ``T`` positions (padding positions hold
            whatever HF computes there: use ``committed_valid``).
        """
        B, T = input_ids.shape
        device = input_ids.device
        self._check_length(T - 1)
        if attention_mask is None:
            valid, all_valid = torch.ones_like(input_ids, dtype=torch.bool), True
        else:
            valid = attention_mask.bool()
            all_valid = bool(valid.all())  # host sync, once per prompt
        positions = (valid.long().cumsum(1) - 1).clamp_(min=0)
        cache = _new_cache()
        out = self._run(input_ids, None if all_valid else valid.long(), positions, cache,
                        logits_to_keep=1 if last_logits_only else 0)
        if last_logits_only and out.logits.shape[1] != 1:
            out = ForwardOutput(logits=out.logits[:, -1:], features=out.features)
        empty = torch.empty(B, 0, dtype=torch.long, device=device)
        state = CacheState(cache=cache, committed_valid=valid, lengths=valid.sum(1), pending_parents=empty,
                           pending_present=empty.bool(), all_valid=all_valid, ticket=_Ticket())
        return out, state

    @torch.no_grad()
    def decode(self, state: CacheState, tokens: torch.Tensor) -> tuple[ForwardOutput, CacheState]:
        """Run one token per row on the committed cache and keep it: HF's own one-token decode step.

        Nothing is pending and nothing needs compacting, so the token simply stays in the cache. HF gets the 2-D
        padding mask (``None`` when every committed slot is valid), as its ``generate`` passes it, and builds the
        same mask, so the same attention kernel runs (in bf16 the logits equal HF's bit for bit). Every row keeps
        its token, finished rows included (as in HF), so no hole appears.

        Args:
            state: a state with no pending slots (consumed).
            tokens: Shape ``[B]`` int64, each row's next token (the root).

        Returns:
            ``(ForwardOutput, state)``: logits ``[B, 1, V]``, features ``[B, 1, H]``; the state has one more
            committed slot per row.
        """
        if state.num_pending:
            raise ValueError(f"decode() needs a state with no pending slots, this one has {state.num_pending}: "
                             f"commit() the pending tree first")
        _consume(state, "decode")
        valid = torch.cat([state.committed_valid, self._ones(tokens)], 1)
        out = self._run(tokens[:, None], None if state.all_valid else valid, state.lengths[:, None], state.cache)
        return out, state._replace(committed_valid=valid, lengths=state.lengths + 1, ticket=_Ticket())

    def _ones(self, tokens: torch.Tensor) -> torch.Tensor:
        """A ``[B, 1]`` all-true column on the tokens' device (cached: built once per batch size)."""
        key = (tokens.shape[0], tokens.device)
        if self._ones_key != key:
            self._ones_key, self._ones_col = key, torch.ones(tokens.shape[0], 1, dtype=torch.bool,
                                                             device=tokens.device)
        return self._ones_col

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
            ``(ForwardOutput, state)`` with ``M`` more pending slots (``state`` is consumed).
        """
        _consume(state, "forward")
        B, M = tokens.shape
        if present is None:
            present = torch.ones_like(tokens, dtype=torch.bool)
        all_parents = torch.cat([state.pending_parents, parents], 1)
        all_present = torch.cat([state.pending_present, present], 1)
        # Committed slots (where valid) plus each node's pending ancestors and itself, written in one launch on CUDA
        # (specdec.kernels.tree_mask; its torch reference elsewhere). An absent node sees only itself.
        mask = tree_mask(state.committed_valid, all_parents, present, self.model.dtype).mask
        out = self._run(tokens, mask, positions, state.cache, tree=True)
        return out, state._replace(pending_parents=all_parents, pending_present=all_present, ticket=_Ticket())

    @torch.no_grad()
    def commit(self, state: CacheState, keep: torch.Tensor, counts: torch.Tensor, *, prefix: bool | None = None,
               full: bool | None = None) -> CacheState:
        """Keep, per row, a path of pending slots as committed tokens and drop every other pending slot.

        Args:
            state: a state with ``P`` pending slots (consumed).
            keep: Shape ``[B, A]`` int64, pending indices to keep, in sequence order, ``-1`` padded; ``A``
                should be the largest count (the cache grows by ``A`` slots).
            counts: Shape ``[B]`` int64, how many entries of ``keep`` are real per row.
            prefix: the caller knows (on the host) whether every row keeps a prefix of its pending slots
                (``keep[b, j] == j`` for ``j < counts[b]``, e.g. a chain): then the cache is cut instead of
                gathered. ``None``: found out on the device.
            full: the caller knows whether every row keeps all ``A`` entries (no hole appears). ``None``: found
                out on the device. ``prefix`` and ``full`` left ``None`` cost one host sync together.

        Returns:
            The state with no pending slots and ``Lc + A`` committed slots.
        """
        _consume(state, "commit")
        P = state.num_pending
        B, A = keep.shape
        Lc = state.committed_valid.shape[1]
        device = keep.device
        ar = torch.arange(A, device=device)[None, :]
        if A and (prefix is None or full is None):
            # One host sync: is the kept path a prefix of the pending slots (a cut, no gather), does it leave holes?
            found = torch.stack([((keep == ar) | (ar >= counts[:, None])).all(), (counts == A).all()]).tolist()
            prefix = found[0] if prefix is None else prefix
            full = found[1] if full is None else full
        prefix = bool(prefix) and A <= P
        # Every layer's accepted path gathered behind the committed slots: one launch on CUDA
        # (specdec.kernels.compact_kv; in place, since HF's cache replaces these tensors at every forward).
        layers = [layer for layer in state.cache.layers if layer.keys is not None]
        keys, values = compact_kv([la.keys for la in layers], [la.values for la in layers], keep, counts, Lc,
                                  inplace=True, prefix=prefix)
        for layer, k, v in zip(layers, keys, values):
            layer.keys, layer.values = k, v
        new_valid = ar < counts[:, None]
        empty = torch.empty(B, 0, dtype=torch.long, device=device)
        return CacheState(cache=state.cache, committed_valid=torch.cat([state.committed_valid, new_valid], 1),
                          lengths=state.lengths + counts, pending_parents=empty, pending_present=empty.bool(),
                          all_valid=state.all_valid and (A == 0 or bool(full)), ticket=_Ticket())

    def check_positions(self, max_position: int) -> None:
        """Raise a clear error if ``max_position`` is past what the model supports."""
        self._check_length(max_position)
