"""P-EAGLE: an EAGLE-3-style head that drafts all ``K`` tokens in one forward (parallel drafting).

The head is an :class:`~specdec.heads.Eagle3Head` (``fc`` over the concatenated target features, the fused-input
layer 0, further Llama layers, own ``norm`` and ``lm_head``) plus two learned parameters:

- ``mask_hidden`` (``[n_aux * H_t]``): the conditioning feature of every slot not generated yet. It goes through
  ``fc`` like the target's real (concatenated) features, so the slot's hidden is ``fc(mask_hidden)``.
- ``mask_embedding`` (``[H]``): the embedding of ``mask_token_id``, the token of those slots.

One step's forward, per row with ``n`` newly committed entries (root + accepted drafts) at positions
``p_0 .. p_0 + n - 1``, is the layout of :func:`specdec.kernels.parallel_draft_inputs`::

    slot      0 .. n-2           n-1                 n .. n+K-2
    token     x_{p+1}            next (new root)     mask_token_id
    hidden    fc(f_p)            fc(f_{p_0+n-1})     fc(mask_hidden)
    position  p                  p_0 + n - 1         p_0 + n - 1 + d

Each slot attends causally over the head's KV cache of earlier committed entries and the block's earlier slots;
the outputs at slots ``n-1 .. n+K-2`` give the logits of levels ``1..K``. The committed slots' keys are written
into the cache at their positions (they stay); the mask slots' keys land past the row's real positions and are
overwritten by the next step's entries. One forward per step, whatever ``K``: deeper ``K`` costs ``K - 1`` more
query rows of a small model, not ``K - 1`` more forwards.

Mask token id: if the target's vocabulary has a spare id (e.g. a reserved token), pass it as ``mask_token_id``;
vLLM needs an id inside the vocabulary. Otherwise the head owns one extra embedding row: ``mask_token_id = V``
(the default). Either way the mask slot's embedding is the learned ``mask_embedding``, never the target's row.

References:
    - P-EAGLE: "Parallel-Drafting EAGLE with Scalable Training", arXiv 2602.01469 (AWS; speculators ``peagle``,
      vLLM ``parallel_drafting``).
    - EAGLE-3: Li et al., arXiv 2503.01840; PARD, An et al., arXiv 2504.18583 (mask tokens for parallel drafts).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..drafters.parallel import LevelOutput
from ..graphs import BoundMark, Step, mark_bound, run_step, settle_bound, static_buffers
from ..kernels.parallel_inputs import parallel_draft_inputs
from .eagle import Eagle3Head, EagleConfig, HeadCache, _config_from_target, default_feature_layers, target_dims

__all__ = ["PEagleConfig", "PEagleHead", "PEagleState", "peagle_feature_layers"]


@dataclass(frozen=True)
class PEagleConfig(EagleConfig):
    """Sizes of a P-EAGLE head: an :class:`~specdec.heads.EagleConfig` plus the parallel-drafting fields.

    Attributes:
        max_drafts: ``K_max``, levels one forward can draft (``num_levels`` of the head).
        mask_token_id: token id of the mask slots; ``None`` means ``vocab_size`` (one extra row owned by the head).
    """

    max_drafts: int = 4
    mask_token_id: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_drafts < 1:
            raise ValueError(f"max_drafts must be >= 1 (drafts per forward), got {self.max_drafts}")
        if self.mask_token_id is None:
            object.__setattr__(self, "mask_token_id", self.vocab_size)
        if not 0 <= self.mask_token_id <= self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} must lie in [0, vocab_size={self.vocab_size}] "
                             f"(a spare id of the target's vocabulary, or vocab_size for an extra row)")


def peagle_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """Default target layers of a P-EAGLE head (HF ``hidden_states`` indices).

    ``(2, N // 2, N - 3)`` (EAGLE-3's low/mid/high, vLLM's ``eagle_aux_hidden_state_layer_ids``) for ``N >= 4``;
    for smaller targets every decoder layer's output, ``(1, ..., N)``.

    Args:
        num_target_layers: ``N``.

    Returns:
        A tuple of layer indices.
    """
    if num_target_layers >= 4:
        return default_feature_layers(num_target_layers, "eagle3")
    return tuple(range(1, num_target_layers + 1))


class _Pending(NamedTuple):
    """Committed entries not yet in the head's cache (the next forward writes them), left-aligned per row."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    num_valid: torch.Tensor
    next_tokens: torch.Tensor
    starts: torch.Tensor


class PEagleState(NamedTuple):
    """What a :class:`PEagleHead` carries between steps (inside a ``ParallelState``).

    Attributes:
        cache: the head's KV cache (slot = position; written in place, so a state is consumed, not reused).
        pending: the committed entries the next forward absorbs (tokens ``[B, M]``, hidden ``[B, M, H]``,
            ``num_valid [B]``, ``next_tokens [B]`` = the new roots, ``starts [B]`` = position of entry 0).
        bound: host-side upper bound of ``starts`` (when the cache must grow; no host sync).
        written: whether a forward has already written ``pending`` into the cache (then :meth:`PEagleHead.update`
            need not absorb it first).
        since_resync: updates since ``bound`` was last re-tightened (every ``PEagleHead.resync_every`` updates, from
            a non-blocking copy of the starts, once it has arrived).
        mark: a re-tightening of ``bound`` under way (:func:`~specdec.graphs.mark_bound`), or ``None``.
    """

    cache: HeadCache
    pending: _Pending
    bound: int
    written: bool = False
    since_resync: int = 0
    mark: BoundMark | None = None


def _round_up(n: int, m: int = 16) -> int:
    return (n + m - 1) // m * m


class PEagleHead(Eagle3Head):
    """P-EAGLE head: EAGLE-3's layers plus a learned mask-slot hidden state and mask-token embedding.

    .. math::
        h_j = \\begin{cases} W_{fc}[l_p; m_p; h_p] & \\text{committed slot at position } p \\\\
                             W_{fc}\\, \\mathrm{mask\\_hidden} & \\text{mask slot} \\end{cases},\\qquad
        e_j = \\begin{cases} e(x_{p+1}) & \\text{committed} \\\\ \\mathrm{mask\\_embedding} & \\text{mask}
        \\end{cases}

    then EAGLE-3's decoder over ``(e_j, h_j)`` at positions ``p_0 + j`` (causal over the cache and the block),
    and ``q_d = \\mathrm{softmax}(\\mathrm{lm\\_head}(\\mathrm{norm}(o_{n-1+d-1})))`` for levels ``d = 1..K``.

    Implements :class:`~specdec.drafters.parallel.ParallelHead` (stateful: ``start`` / ``update`` store the
    committed entries, ``level_logits`` runs the one forward that absorbs them and drafts) with the step hooks
    (``draft_step`` / ``absorb_step`` / ``start(static=)``) that let :func:`specdec.graphs.cuda_graphed` capture
    them: the steps attend over the whole cache under the causal mask (static shapes per batch, capacity, width
    and ``K``), and ``bound``, a host-side upper bound of the rows' starts, only decides when the cache grows
    (re-tightened every ``resync_every`` updates from a non-blocking copy of the starts, once it has arrived).

    Args:
        config: a :class:`PEagleConfig`.
        embed_weight: token embeddings, frozen, not trained, not saved (the target's). Shape: ``[V, H]``.
        d2t: optional reduced draft vocabulary offsets. Shape: ``[V_draft]`` int64.
        t2d: its target mask. Shape: ``[V]`` bool.

    Example:
        >>> head = PEagleHead.from_target(model, max_drafts=6)          # doctest: +SKIP
        >>> drafter = specdec.recipes.peagle(head)                         # doctest: +SKIP

    References:
        P-EAGLE arXiv 2602.01469; EAGLE-3 arXiv 2503.01840.
    """

    kind = "P-EAGLE"
    #: updates between the re-tightenings of the cache bound (non-blocking copies of the starts)
    resync_every: int = 16

    def __init__(self, config: PEagleConfig, embed_weight: torch.Tensor, d2t: torch.Tensor | None = None,
                 t2d: torch.Tensor | None = None):
        if not isinstance(config, PEagleConfig):
            raise TypeError(f"config must be a PEagleConfig, got {type(config).__name__}")
        super().__init__(config, embed_weight, d2t, t2d)
        generator = torch.Generator().manual_seed(1)
        n_in = len(config.feature_layers) * config.feature_size
        self.mask_hidden = nn.Parameter(torch.randn(n_in, generator=generator) * config.initializer_range)
        self.mask_embedding = nn.Parameter(embed_weight.detach().float().mean(0).to(embed_weight.dtype).clone())

    @classmethod
    def from_target(cls, target, *, num_layers: int = 2, max_drafts: int = 4,
                    feature_layers: Sequence[int] | None = None, mask_token_id: int | None = None,
                    draft_vocab: tuple[torch.Tensor, torch.Tensor] | None = None,
                    intermediate_size: int | None = None) -> PEagleHead:
        """A fresh (randomly initialised) P-EAGLE head for ``target``.

        Args:
            target: an HF causal LM; its embeddings are shared, frozen.
            num_layers: decoder layers (speculators' default is 4; 2 suits small targets).
            max_drafts: ``K_max``, drafts one forward proposes.
            feature_layers: HF ``hidden_states`` indices to fuse (default :func:`peagle_feature_layers`).
            mask_token_id: a spare id of the target's vocabulary (default: an extra row, id ``V``).
            draft_vocab: optional ``(d2t, t2d)`` reduced vocabulary (:func:`specdec.training.build_draft_vocab`).
            intermediate_size: MLP width (default: the target's).

        Returns:
            A :class:`PEagleHead` on the target's device and dtype.

        References:
            P-EAGLE arXiv 2602.01469.
        """
        _, n_layers, _ = target_dims(target)
        layers = tuple(feature_layers) if feature_layers is not None else peagle_feature_layers(n_layers)
        for i in layers:
            if not 0 <= i <= n_layers:
                raise ValueError(f"feature layer {i} is out of range for a target with {n_layers} layers "
                                 f"(HF hidden_states indices 0..{n_layers})")
        d2t, t2d = draft_vocab if draft_vocab is not None else (None, None)
        base = _config_from_target(target, layers, num_layers=num_layers, intermediate_size=intermediate_size,
                                   draft_vocab_size=None if d2t is None else int(d2t.shape[0]))
        config = PEagleConfig(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                              max_drafts=max_drafts, mask_token_id=mask_token_id)
        emb = target.get_input_embeddings().weight
        head = cls(config, emb, d2t, t2d)
        return head.to(device=emb.device, dtype=emb.dtype)

    # ---- the ParallelHead attributes -------------------------------------------------------------------

    @property
    def num_levels(self) -> int:
        """``K_max``: levels one forward drafts."""
        return self.config.max_drafts

    @property
    def vocab_size(self) -> int:
        """``V``, the target vocabulary (the width of :meth:`level_logits`)."""
        return self.config.vocab_size

    @property
    def mask_token_id(self) -> int:
        """Token id of the mask slots."""
        return self.config.mask_token_id

    # ---- building blocks -------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; ``mask_token_id`` gets the learned ``mask_embedding``.

        Args:
            input_ids: Shape ``[B, T]`` int64, ids in ``[0, V]`` (``V`` only as the mask id).

        Returns:
            Shape ``[B, T, H]``.
        """
        rows = F.embedding(input_ids.clamp(0, self.embed_weight.shape[0] - 1), self.embed_weight)
        is_mask = (input_ids == self.mask_token_id)[..., None]
        return torch.where(is_mask, self.mask_embedding.to(rows.dtype), rows)

    def mask_slot_hidden(self) -> torch.Tensor:
        """``fc(mask_hidden)``: the hidden of every mask slot.

        Returns:
            Shape ``[H]``.
        """
        return self.fc(self.mask_hidden.to(self.dtype))

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits spread over the target vocabulary (``-inf`` outside the draft vocabulary).

        Args:
            draft_logits: Shape ``[..., V_draft]``.

        Returns:
            Shape ``[..., V]`` (the input itself without a reduced vocabulary).
        """
        if self.config.draft_vocab == self.config.vocab_size:
            return draft_logits
        ids = torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t
        out = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return out.index_copy(-1, ids, draft_logits)

    def draft_block(self, pending: _Pending, cache: HeadCache, num_drafts: int, kv_length: int) -> torch.Tensor:
        """The one forward of a step: write the pending entries' keys, draft ``num_drafts`` levels.

        Args:
            pending: the committed entries to absorb (see :class:`PEagleState`).
            cache: the head's cache (written in place; capacity ``>= max(starts) + M + num_drafts - 1``).
            num_drafts: ``K`` (``K - 1`` mask slots).
            kv_length: attend over slots ``[0, kv_length)`` (an upper bound of the rows' last slot + 1).

        Returns:
            Target-vocabulary logits of levels ``1..K``. Shape: ``[B, K, V]``.
        """
        inputs = parallel_draft_inputs(pending.tokens, pending.hidden, pending.num_valid, pending.next_tokens,
                                       pending.starts, self.mask_slot_hidden().to(pending.hidden.dtype),
                                       num_drafts=num_drafts, mask_token_id=self.mask_token_id)
        slots = torch.arange(kv_length, device=inputs.positions.device)
        sees = slots[None, None, :] <= inputs.positions[:, :, None]                       # [B, W, S]
        out = self(inputs.input_ids, inputs.hidden, inputs.positions, sees[:, None], cache, inputs.positions,
                   kv_length)
        picked = out.gather(1, inputs.sample_indices[..., None].expand(-1, -1, out.shape[-1]))  # [B, K, H]
        return self.target_logits(self.logits(picked))

    # ---- the stateful protocol -------------------------------------------------------------------------

    def _pending(self, tokens: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, roots: torch.Tensor,
                 features: tuple[torch.Tensor, ...], starts: torch.Tensor) -> _Pending:
        """Left-align the feedback's valid entries (a prompt is left-padded) and project its features."""
        valid = valid.bool()
        B, M = valid.shape
        first = valid.long().argmax(1)                                                    # 0 where none is valid
        index = (first[:, None] + torch.arange(M, device=valid.device)).clamp(max=M - 1)   # [B, M]
        hidden = self.features_to_hidden(tuple(f.gather(1, index[..., None].expand(-1, -1, f.shape[-1]))
                                               for f in features))
        num_valid = valid.sum(1)
        starts = torch.where(num_valid > 0, positions.gather(1, first[:, None])[:, 0], starts)
        return _Pending(tokens.gather(1, index), hidden, num_valid, roots.long(), starts)

    def _with_capacity(self, cache: HeadCache | None, batch: int, need: int, device) -> HeadCache:
        if cache is not None and cache.capacity >= need:
            return cache
        new = self.new_cache(batch, _round_up(max(need, 2 * cache.capacity if cache is not None else need)), device)
        if cache is not None:
            new.keys[:, :, :, :cache.capacity] = cache.keys
            new.values[:, :, :, :cache.capacity] = cache.values
        return new

    @torch.no_grad()
    def start(self, feedback, *, static: bool = False, buffers: HeadCache | None = None) -> PEagleState:
        """Store the prompt's entries (absorbed by the first :meth:`level_logits`).

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback` (left padding invalid).
            static: allocate a cache meant to stay put (with headroom), for :mod:`specdec.graphs`.
            buffers: with ``static``, the cache of an earlier run (``Step.buffers``), reused when it fits.

        Returns:
            A :class:`PEagleState`.
        """
        B, M = feedback.tokens.shape
        device = feedback.tokens.device
        pending = self._pending(feedback.tokens, feedback.valid, feedback.positions, feedback.roots,
                                tuple(feedback.features), torch.zeros(B, dtype=torch.long, device=device))
        need = M + 2 * self.num_levels + 1
        if not static:
            cache = self._with_capacity(None, B, need, device)
        else:  # the previous run's cache when it fits (its graphs stay valid), else one with headroom: 256 entries
            # plus what the bound may overshoot between resyncs
            cache = static_buffers(buffers, B, need, device, lambda n: self.new_cache(B, n, device),
                                   slack=256 + self.resync_every * (self.num_levels + 1))
        return PEagleState(cache, pending, 0)

    @torch.no_grad()
    def update(self, state: PEagleState, feedback) -> PEagleState:
        """Store a step's committed entries; absorb the previous ones first if no forward did (a plain step).

        Args:
            state: the current state.
            feedback: the step's :class:`~specdec.drafters.Feedback` (left-aligned, finished rows all invalid).

        Returns:
            The new :class:`PEagleState`.
        """
        return run_step(self.absorb_step(state, feedback))

    # ---- the steps (specdec.graphs captures them through ParallelDrafter) ----------------------------------

    def _narrow(self, width: int) -> bool:
        return width <= self.num_levels + 1  # a step's entries; a prompt is wider (one shape per length: eager)

    def draft_step(self, state: PEagleState, request) -> Step:
        """:meth:`level_outputs` as a :class:`~specdec.graphs.Step` over the whole cache (capturable).

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (its ``num_drafts`` sets ``K``).

        Returns:
            A step: inputs the pending entries (tokens, hidden, num_valid, next_tokens, starts); ``fn`` returns
            ``(LevelOutput(logits [B, K, V]), None)``; ``finish`` returns the state marked written; key
            ``("peagle", K)``, or ``None`` while the pending entries are a prompt's.
        """
        K = max(1, min(self.num_levels, int(request.num_drafts)))
        cache = state.cache

        def draft(*pending: torch.Tensor) -> tuple[LevelOutput, None]:
            return LevelOutput(logits=self.draft_block(_Pending(*pending), cache, K, cache.capacity)), None

        key = ("peagle", K) if self._narrow(state.pending.tokens.shape[1]) else None
        return Step(fn=draft, inputs=tuple(state.pending), finish=lambda _: state._replace(written=True), key=key,
                    buffers=cache)

    def absorb_step(self, state: PEagleState, feedback) -> Step:
        """:meth:`update` as a :class:`~specdec.graphs.Step` (capturable; the cache grows before it, on the host).

        Args:
            state: the current state.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            A step: inputs the old pending entries (only their ``(starts, num_valid)`` once a forward wrote
            them), then the feedback's tokens, valid, positions, roots and features; ``fn`` returns the new pending
            entries (after absorbing the old ones into the cache when no forward did: a plain step); key
            ``("update", written)``, or ``None`` for a prompt's width.
        """
        old = state.pending
        width = old.tokens.shape[1]
        B, M = feedback.tokens.shape
        # (the true bound is waited for only when the cache would otherwise grow: new graphs)
        grows = state.bound + width + M + self.num_levels > state.cache.capacity
        bound, mark = settle_bound(state.bound, state.mark, wait=grows)
        bound += width  # each row's new start <= its old start + its old entries
        cache = self._with_capacity(state.cache, B, bound + M + self.num_levels, feedback.tokens.device)
        written = state.written

        def absorb(old_inputs: tuple, fb_tokens, fb_valid, fb_positions, fb_roots, features) -> _Pending:
            if written:  # a forward already wrote the old entries: only where they end is needed
                starts, num_valid = old_inputs
            else:  # a plain step (K = 0) ran no forward: absorb the entries now
                pending = _Pending(*old_inputs)
                self.draft_block(pending, cache, 1, cache.capacity)
                starts, num_valid = pending.starts, pending.num_valid
            return self._pending(fb_tokens, fb_valid, fb_positions, fb_roots, features, starts + num_valid)

        def finish(pending: _Pending) -> PEagleState:
            since, new_mark = state.since_resync + 1, mark
            if since >= self.resync_every and new_mark is None:  # re-tightened once the copy has arrived
                new_mark, since = mark_bound(pending.starts, bound), 0
            return PEagleState(cache, _Pending(*pending), bound, False, since, new_mark)

        key = ("update", written) if self._narrow(M) and (written or self._narrow(width)) else None
        inputs = ((old.starts, old.num_valid) if written else tuple(old), feedback.tokens, feedback.valid,
                  feedback.positions, feedback.roots, tuple(feedback.features))
        return Step(fn=absorb, inputs=inputs, finish=finish, key=key, buffers=cache)

    @torch.no_grad()
    def level_logits(self, state: PEagleState, request=None) -> torch.Tensor:
        """One forward: absorb the pending entries and draft ``K = min(K_max, request.num_drafts)`` levels.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (``None``: ``K_max`` levels).

        Returns:
            Shape ``[B, K, V]``. The state is not marked as absorbed (a later :meth:`update` writes the same keys
            again, harmlessly); :meth:`level_outputs` returns the marked successor.
        """
        K = self.num_levels if request is None else max(1, min(self.num_levels, int(request.num_drafts)))
        # the whole cache under the causal mask: the same shapes every step (CUDA graphs)
        return self.draft_block(state.pending, state.cache, K, state.cache.capacity)

    @torch.no_grad()
    def level_outputs(self, state: PEagleState, request=None) -> LevelOutput:
        """:meth:`level_logits`, with the successor state (its pending entries now in the cache).

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest`.

        Returns:
            ``LevelOutput(logits [B, K, V], state=<state marked written>)``.
        """
        return LevelOutput(logits=self.level_logits(state, request), state=state._replace(written=True))

    @torch.no_grad()
    def chain_logits_ref(self, tokens: torch.Tensor, features: Sequence[torch.Tensor], next_tokens: torch.Tensor,
                         num_drafts: int) -> torch.Tensor:
        """Reference: draft logits after a whole unpadded sequence, from one uncached causal forward.

        The sequence's entries ``(x_{t+1}, f_t)`` for ``t < T - 1``, then ``(next, f_{T-1})`` and ``K - 1`` mask
        slots, at positions ``0 .. T + K - 2``. The cached, step-by-step path must give the same logits.

        Args:
            tokens: committed tokens. Shape: ``[B, T]`` int64.
            features: the target's features at them, one per feature layer. Shape: each ``[B, T, H_t]``.
            next_tokens: the root after them. Shape: ``[B]`` int64.
            num_drafts: ``K``.

        Returns:
            Shape ``[B, K, V]``.
        """
        B, T = tokens.shape
        hidden = self.features_to_hidden(features)
        ids = torch.cat([tokens[:, 1:], next_tokens[:, None], tokens.new_full((B, num_drafts - 1),
                                                                               self.mask_token_id)], 1)
        hidden = torch.cat([hidden, self.mask_slot_hidden().to(hidden.dtype).expand(B, num_drafts - 1, -1)], 1)
        positions = torch.arange(T + num_drafts - 1, device=tokens.device)[None].expand(B, -1)
        out = self(ids, hidden, positions)
        return self.target_logits(self.logits(out[:, T - 1:]))
