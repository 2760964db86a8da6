"""The EAGLE drafter: an autoregressive feature head (EAGLE-1 / EAGLE-3) driven by a tree policy.

:class:`EagleDrafter` implements the :class:`~specdec.drafters.Drafter` protocol around an
:class:`~specdec.heads.Eagle1Head` or :class:`~specdec.heads.Eagle3Head`, with any tree policy of
:mod:`specdec.trees` (``StaticTree``, ``SampledTree``, ``DynamicTree``). Its core is generic over
autoregressive feature heads: it keeps the head's KV cache and calls the policy with an ``expand`` callback
(:mod:`specdec.trees.dynamic`); what is EAGLE about it is only the head's calling convention
(``features_to_hidden``, ``head(tokens, hidden, positions, mask, cache, slots)``, ``logits``,
``draft_to_target``). The methods are recipes in :mod:`specdec.recipes` (``eagle1``, ``eagle2``, ``eagle3``).

The head's KV cache, per row (slot = position of the feature, so rows stay aligned without compaction)::

    [ committed entries 0..len_b-1 | stale (masked) .. bound | free ... | tree scratch | trash slot ]

``update`` runs the head once over the newly committed entries (root + accepted drafts), writing their keys
at their positions; the output at the last one is the root's hidden state, whose logits give level 1.
``propose`` then runs one forward per further level over that level's expanded nodes, writing their keys
into the scratch region at the end of the cache (never into the committed part, so rejected branches leave
no trace). Every forward attends over the whole cache under a mask, so a step's shapes depend only on the
batch size, the capacity, the depth and the feedback width: the steps are :class:`~specdec.graphs.Step` s that
:func:`specdec.graphs.cuda_graphed` captures once per shape and replays (``draft_step`` / ``absorb_step``; the
recipes apply it on request). ``bound`` is a host-side upper bound of the row lengths, advanced by the feedback
width, so no step needs a host-device sync (every ``resync_every`` updates a non-blocking copy of the lengths to
the host re-tightens it once it has arrived; only a cache about to grow waits for it).

References:
    EAGLE arXiv 2401.15077; EAGLE-2 arXiv 2406.16858; EAGLE-3 arXiv 2503.01840.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..graphs import BoundMark, Step, mark_bound, run_step, settle_bound, static_buffers
from ..heads.eagle import Eagle1Head, Eagle3Head, HeadCache
from ..kernels import head_tree_mask, head_update_mask, last_rows, table_rows
from ..trees.dynamic import VocabMap
from ..trees.static import as_policy
from ..types import Draft, DraftScheme
from .base import Feedback, ProposeRequest

__all__ = ["EagleDrafter", "EagleState"]


class EagleState(NamedTuple):
    """What an :class:`EagleDrafter` carries between steps.

    Attributes:
        cache: the head's KV cache (written in place: a state is consumed by the next call, not reused).
        lengths: Shape ``[B]`` int64, committed entries per row (= the root's position).
        bound: host-side upper bound of ``lengths`` (decides when the cache must grow; no sync needed).
        last_hidden: Shape ``[B, H]``, the head's output at the last committed entry (predicts level 1).
        num_forwards: head forwards so far (read by ``generate()``'s statistics).
        since_resync: updates since ``bound`` was last re-tightened.
        mark: a re-tightening of ``bound`` under way (:func:`~specdec.graphs.mark_bound`), or ``None``.
    """

    cache: HeadCache
    lengths: torch.Tensor
    bound: int
    last_hidden: torch.Tensor
    num_forwards: int
    since_resync: int
    mark: BoundMark | None = None


def _round_up(n: int, m: int = 64) -> int:
    return (n + m - 1) // m * m


class _Tables(NamedTuple):
    """Constants of the steps over a cache of one capacity, made once on the host (never inside a capture) and kept
    while the drafter lives, so that graphs captured on them stay valid: the head's RoPE rows of every slot's
    position, and the index vectors a draft would otherwise make at every replay."""

    rope: torch.Tensor  # [C, 2, d]: cos and sin at positions 0..C-1 in the head's dtype (head.rotary's values)
    levels: torch.Tensor  # [max(depth - 1, 1)] int64: 0, 1, ... (level l of a tree sits at root + l - 1)
    scratch: torch.Tensor  # [scratch] int64: the scratch slots S0 .. C - 2


def _rope_rows(table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``head.rotary(positions, dtype)`` read from a :class:`_Tables` ``rope`` table (one launch on CUDA: the rows at
    the positions clamped into the table, so that no stale position of a padded entry indexes past it):
    ``(cos, sin)``, ``[B, 1, T, d]``."""
    rows = table_rows(table, positions)  # [B, T, 2, d]
    return rows[:, None, :, 0], rows[:, None, :, 1]


class EagleDrafter:
    """Drafter for the EAGLE family: an EAGLE head plus a tree policy (eager; see :mod:`specdec.graphs`).

    Args:
        head: an :class:`~specdec.heads.Eagle1Head` or :class:`~specdec.heads.Eagle3Head` (on the target's
            device).
        tree: the tree policy: :class:`~specdec.trees.DynamicTree` (default ``DynamicTree()``: EAGLE-2),
            :class:`StaticTree` / a compiled tree / tree choices (EAGLE-1), or :class:`SampledTree`.
        resync_every: updates between the re-tightenings of the cache bound (each a non-blocking copy of the
            lengths to the host, read once it has arrived).
        fold: let a graphed wrapper run the update and the next draft inside the fast path's verify step
            (:attr:`folds_drafts`; experimental, off by default).

    Attributes:
        max_num_drafts: the policy's depth (a step's ``K`` prunes the tree to depth ``K``).
        feature_layers: the head's target layers.
        vocab_size: the target vocabulary the head was made for.

    Example:
        >>> drafter = EagleDrafter(Eagle1Head.from_target(model), DynamicTree(60, 6, 10))  # doctest: +SKIP
        >>> out = specdec.generate(model, ids, drafter=specdec.graphs.cuda_graphed(drafter))  # doctest: +SKIP

    References:
        EAGLE arXiv 2401.15077; EAGLE-2 arXiv 2406.16858; EAGLE-3 arXiv 2503.01840.
    """

    def __init__(self, head, tree=None, *, resync_every: int = 16, fold: bool = False):
        if not isinstance(head, (Eagle1Head, Eagle3Head)):
            raise TypeError(f"head must be an Eagle1Head or Eagle3Head, got {type(head).__name__}; load one with "
                            f"specdec.formats.load_eagle_head(path, target)")
        self.head = head
        self.policy = as_policy(tree)
        self.max_num_drafts = self.policy.max_depth
        self.feature_layers = tuple(head.feature_layers)
        self.vocab_size = head.config.vocab_size
        self.resync_every = resync_every
        self.fold = bool(fold)
        self._scratch = self.policy.scratch_slots(self.max_num_drafts)
        self._tables: dict[tuple, _Tables] = {}

    def __repr__(self) -> str:
        return f"EagleDrafter({type(self.head).__name__}, {self.policy!r})"

    @property
    def folds_drafts(self) -> bool:
        """Whether :class:`~specdec.graphs.GraphedDrafter` may run the update and the next draft inside the fast
        path's verify step (:meth:`~specdec.graphs.GraphedDrafter.fold_for`; a greedy :meth:`draft_step` reads of a
        request only ``num_drafts`` and ``root_positions``): only when built with ``fold=True``. Off by default:
        on the H200 (session 30) the fold took 3.5% off a fixture EAGLE-2 / EAGLE-3 step but made the 7B EAGLE-2
        step 0.14-0.45 ms slower (queued / from an idle device; the same kernel time)."""
        return self.fold

    # ---- cache bookkeeping ---------------------------------------------------------------------------

    def _scratch_start(self, cache: HeadCache) -> int:
        return cache.capacity - 1 - self._scratch  # scratch slots, then the trash slot, end the cache

    def _tables_for(self, cache: HeadCache) -> _Tables:
        """The :class:`_Tables` of ``cache``'s capacity (made on the first call for it, then reused)."""
        head, C = self.head, cache.capacity
        device = cache.keys.device
        key = (C, device, head.dtype, head.rotary.inv_freq.device)
        tables = self._tables.get(key)
        if tables is None:
            with torch.no_grad():
                cos, sin = head.rotary(torch.arange(C, device=device)[None], head.dtype)  # [1, 1, C, d] each
                levels = max(self.max_num_drafts - 1, 1)
                tables = _Tables(torch.stack([cos[0, 0], sin[0, 0]], dim=1),
                                 torch.arange(levels, device=device),
                                 torch.arange(self._scratch_start(cache), C - 1, device=device))
            self._tables[key] = tables
        return tables

    def _new_cache(self, feedback: Feedback, static: bool, buffers: HeadCache | None) -> HeadCache:
        B, M = feedback.tokens.shape
        device = feedback.tokens.device
        need = M + 2 * (self.max_num_drafts + 1) + self._scratch + 1
        if not static:
            return self.head.new_cache(B, _round_up(need), device)
        # The previous run's buffer when it fits (graphs captured on it stay valid), else one with headroom.
        return static_buffers(buffers, B, need, device, lambda n: self.head.new_cache(B, n, device))

    @staticmethod
    def _tightened(state: EagleState, wait: bool = False) -> EagleState:
        """``state`` with ``bound`` lowered from its mark (:func:`~specdec.graphs.settle_bound`)."""
        bound, mark = settle_bound(state.bound, state.mark, wait=wait)
        return state._replace(bound=bound, mark=mark)

    def _ensure_capacity(self, state: EagleState, width: int) -> EagleState:
        need = state.bound + width + self._scratch + 1  # + 1: the trash slot for invalid entries
        if need <= state.cache.capacity:
            return state
        state = self._tightened(state, wait=True)  # before growing the cache (new graphs), learn the true bound
        need = state.bound + width + self._scratch + 1
        if need <= state.cache.capacity:
            return state
        exact = int(state.lengths.max())  # a settled old mark is still loose by every update since: read (one sync)
        if exact < state.bound:
            state = state._replace(bound=exact, mark=None, since_resync=0)
            need = exact + width + self._scratch + 1
            if need <= state.cache.capacity:
                return state
        old = state.cache
        new = self.head.new_cache(old.keys.shape[1], _round_up(max(need, 2 * old.capacity)), old.keys.device,
                                  old.keys.dtype)
        new.keys[:, :, :, : state.bound] = old.keys[:, :, :, : state.bound]
        new.values[:, :, :, : state.bound] = old.values[:, :, :, : state.bound]
        return state._replace(cache=new)

    # ---- the protocol --------------------------------------------------------------------------------

    @torch.no_grad()
    def start(self, feedback: Feedback, *, static: bool = False, buffers: HeadCache | None = None) -> EagleState:
        """Run the head over the prompt (target features at every prompt token) and build the state.

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback` (left padding invalid).
            static: allocate a cache meant to stay put (with headroom), for :mod:`specdec.graphs`.
            buffers: with ``static``, the cache of an earlier run (``Step.buffers``), reused when it fits.

        Returns:
            An :class:`EagleState`.
        """
        B = feedback.tokens.shape[0]
        device = feedback.tokens.device
        state = EagleState(self._new_cache(feedback, static, buffers), torch.zeros(B, dtype=torch.long, device=device),
                           0, torch.zeros(B, self.head.config.hidden_size, device=device, dtype=self.head.dtype), 0, 0)
        return run_step(self.absorb_step(state, feedback))

    @torch.no_grad()
    def propose(self, state: EagleState, request: ProposeRequest) -> tuple[Draft, EagleState]:
        """Draft a tree per row: level 1 from the root's hidden state, one head forward per further level.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (``num_drafts`` bounds the depth).

        Returns:
            ``(draft, state)``.
        """
        return run_step(self.draft_step(state, request))

    @torch.no_grad()
    def update(self, state: EagleState, feedback: Feedback) -> EagleState:
        """Absorb the committed tokens (root + accepted drafts) and their target features.

        Args:
            state: the state returned by :meth:`propose`.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            The new :class:`EagleState`.
        """
        return run_step(self.absorb_step(state, feedback))

    # ---- the steps (specdec.graphs captures them) ------------------------------------------------------

    def draft_step(self, state: EagleState, request: ProposeRequest) -> Step:
        """:meth:`propose` as a :class:`~specdec.graphs.Step`: inputs ``(lengths, root_positions, last_hidden)``.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's request.

        Returns:
            A step whose ``finish`` returns ``(draft, state)``; its key is ``("propose", depth)``, or ``None``
            for a sampled tree at temperature > 0 (its draws come from the run's random source).
        """
        if request.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1 (K = 0 is a plain step and never reaches a drafter), got "
                             f"{request.num_drafts}")
        depth = min(self.max_num_drafts, request.num_drafts)
        after = state._replace(num_forwards=state.num_forwards + self.policy.num_forwards(depth))
        sampled = self.policy.scheme is not DraftScheme.DETERMINISTIC and not request.sampling.is_greedy
        cache = state.cache
        tables = self._tables_for(cache)
        ids = self.head.draft_id_table()  # read on the host at every step: a restricted vocabulary is never stale
        to_target = self.head.draft_to_target if ids is None else VocabMap(ids)

        def draft(lengths: torch.Tensor, root_positions: torch.Tensor, last_hidden: torch.Tensor) -> Draft:
            return self._draft(cache, tables, to_target, lengths, root_positions, last_hidden, depth, request)

        return Step(fn=draft, inputs=(state.lengths, request.root_positions, state.last_hidden),
                    finish=lambda out: (out, after), key=None if sampled else ("propose", depth), buffers=cache)

    def absorb_step(self, state: EagleState, feedback: Feedback) -> Step:
        """:meth:`update` as a :class:`~specdec.graphs.Step` (inputs: lengths, last hidden, the feedback tensors).

        Args:
            state: the state returned by :meth:`propose`.
            feedback: the committed entries.

        Returns:
            A step whose ``finish`` returns the new state (reading nothing of ``feedback`` but its width); its key
            is ``("update",)`` for a step's feedback (at most ``max_num_drafts + 1`` entries), ``None`` for wider
            feedback (a prompt).
        """
        B, M = feedback.tokens.shape
        if M == 0:
            return Step(fn=lambda: None, inputs=(), finish=lambda _: state, buffers=state.cache)
        state = self._ensure_capacity(self._tightened(state), M)

        def finish(out: tuple[torch.Tensor, torch.Tensor]) -> EagleState:
            lengths, last_hidden = out
            bound = state.bound + M  # entries continue each row: positions < old length + M
            since, mark = state.since_resync + 1, state.mark
            if since >= self.resync_every and mark is None:  # re-tightened once the copy has arrived
                mark, since = mark_bound(lengths, bound), 0
            return EagleState(state.cache, lengths, bound, last_hidden, state.num_forwards + 1, since, mark)

        cache = state.cache
        tables = self._tables_for(cache)
        inputs = (state.lengths, state.last_hidden, feedback.tokens, feedback.next_tokens, feedback.positions,
                  feedback.valid, tuple(feedback.features))
        # owned_outputs: the new lengths and last hidden state live in the state alone, which the next update
        # consumes; a graph wrapper hands over its own tensors (no clones), which the next draft reads in place
        return Step(fn=lambda *tensors: self._absorb(cache, tables, *tensors), inputs=inputs, finish=finish,
                    key=("update",) if M <= self.max_num_drafts + 1 else None, buffers=cache, owned_outputs=True)

    def _absorb(self, cache: HeadCache, tables: _Tables, lengths: torch.Tensor, last_hidden: torch.Tensor,
                tokens: torch.Tensor,
                next_tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor,
                features: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over the feedback entries (no host sync; static shapes given batch, width, capacity).

        Returns:
            ``(lengths [B], last_hidden [B, H])``.
        """
        head = self.head
        B, M = tokens.shape
        hidden = head.features_to_hidden(features)
        # entries at their positions (padding to the trash slot), each seeing the committed slots up to itself; the
        # rows' new lengths and last real entries: one launch of the tree-mask family (additive on CUDA)
        mask_dtype = head.dtype if tokens.is_cuda else torch.bool
        plan = head_update_mask(lengths, positions, valid.bool(), cache.capacity, mask_dtype)
        rope = _rope_rows(tables.rope, positions)
        out = head(next_tokens, hidden, positions, plan.mask, cache, plan.slots, rope=rope)
        return plan.lengths, last_rows(out, plan.last, last_hidden)  # a row with no real entry keeps its last one

    def _draft(self, cache: HeadCache, tables: _Tables, to_target, lengths: torch.Tensor,
               root_positions: torch.Tensor, last_hidden: torch.Tensor, depth: int, request: ProposeRequest) -> Draft:
        """The tree of one step (no host sync; static shapes given batch, capacity and depth)."""
        head = self.head
        B = lengths.shape[0]
        C, S0 = cache.capacity, self._scratch_start(cache)
        mask_dtype = head.dtype if lengths.is_cuda else torch.bool
        # every level's positions and RoPE rows in one go (level l sits at root + l - 1; its nodes' keys at the
        # scratch slots after the earlier levels'): three launches, then per forward only views of them
        levels = max(depth - 1, 1)
        level_positions = root_positions[:, None] + tables.levels[:levels]
        cos_all, sin_all = _rope_rows(tables.rope, level_positions)
        scratch_slots = tables.scratch

        def expand(tokens: torch.Tensor, parent_hidden: torch.Tensor, visible: torch.Tensor, level: int):
            F, S = tokens.shape[1], visible.shape[-1]
            slots = scratch_slots[S - F:S][None].expand(B, F)
            # committed slots below each row's length, the policy's ancestor sets over the scratch slots, nothing
            # else: one launch of the tree-mask family (on CUDA already additive, as the attention kernel takes it)
            mask = head_tree_mask(lengths, visible, S0, C, mask_dtype)
            if level - 1 < levels:  # [B, 1, 1, d] -> [B, 1, F, d]: every node of the level at one position
                positions = level_positions[:, level - 1:level].expand(B, F)
                rope = tuple(t[:, :, level - 1:level].expand(B, 1, F, t.shape[-1]) for t in (cos_all, sin_all))
            else:  # a policy expanding deeper than depth - 1 (none does): the rows made here
                positions, rope = (root_positions + (level - 1))[:, None].expand(B, F), None
            out = head(tokens, parent_hidden, positions, mask, cache, slots, rope=rope)
            return head.logits(out), out

        # sampling and source are read only by a sampled tree at T > 0, whose step is never captured
        return self.policy.grow(head.logits(last_hidden), last_hidden, expand, depth=depth,
                                draft_to_target=to_target, sampling=request.sampling,
                                source=request.source, vocab_size=head.config.vocab_size)
