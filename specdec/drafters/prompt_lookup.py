"""Prompt lookup (n-gram) drafting: copy what followed the last time the current suffix appeared.

Model-free: the drafter keeps each row's committed tokens (prompt, then every accepted token), finds an earlier
occurrence of the sequence's last ``n`` tokens (longest ``n`` first) and proposes the tokens that followed it as a
chain. It pays off whenever the output repeats its input: code edits, summaries, retrieval-augmented answers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from ..graphs import BoundMark, Step, mark_bound, run_step, settle_bound
from ..kernels.ngram import (
    NgramChain,
    chain_layout,
    find_ngram_continuations,
    find_ngram_continuations_ref,
    ngram_chain,
)
from ..types import Draft, DraftScheme
from .base import Feedback, ProposeRequest

__all__ = ["PromptLookupDrafter", "PromptLookupState", "find_ngram_continuations", "find_ngram_continuations_ref"]

_CAPACITY_STEP = 64
_SPARE = 2  # the root's column (in the draft step's copy) and the column invalid entries are written to
_STATIC_SLACK = 256  # headroom of a static history
_RESYNC_EVERY = 16  # updates between the re-tightenings of the host-side length bound


class PromptLookupState(NamedTuple):
    """Committed token history of every row.

    Attributes:
        history: Shape ``[B, C]`` int64, row ``b``'s committed tokens in ``history[b, :lengths[b]]``
            (left-aligned; the rest has no meaning; the last column receives the writes of invalid entries). The
            current root is not included: it is committed but not yet run by the target, and arrives in
            ``ProposeRequest.roots``.
        lengths: Shape ``[B]`` int64, number of committed tokens per row.
        bound: host-side upper bound of ``lengths`` (decides when ``history`` must grow without a host sync);
            ``None``: unknown (read once when needed).
        static: ``history`` is a buffer meant to stay put (``start(static=True)``, for
            :func:`specdec.graphs.cuda_graphed`): ``update`` writes into it in place and the state is consumed.
            ``False``: ``update`` returns a new state and leaves this one untouched.
        since_resync: updates since ``bound`` was last re-tightened.
        mark: a re-tightening of ``bound`` under way (:func:`~specdec.graphs.mark_bound`), or ``None``.
    """

    history: torch.Tensor
    lengths: torch.Tensor
    bound: int | None = None
    static: bool = False
    since_resync: int = 0
    mark: BoundMark | None = None


def _capacity(need: int, static: bool) -> int:
    """Columns of a history holding ``need`` committed tokens: the two spare columns (the root's, in the draft
    step's copy, and the one invalid entries are written to) added and rounded up; a static one with headroom, so
    that it rarely grows (a new buffer means new graphs)."""
    need += _SPARE + (_STATIC_SLACK if static else 0)
    return -(-need // _CAPACITY_STEP) * _CAPACITY_STEP


def _write(history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Write each row's valid ``tokens`` (in order) after its ``lengths`` committed ones, in place (invalid entries
    go to the last column); returns the new lengths. No host sync."""
    valid = valid.to(torch.bool)
    dest = lengths[:, None] + valid.long().cumsum(dim=1) - 1
    dest = torch.where(valid, dest, history.shape[1] - 1)
    history.scatter_(1, dest, tokens.to(history.dtype))
    return lengths + valid.sum(dim=1)


@dataclass(frozen=True)
class PromptLookupDrafter:
    """Model-free drafter proposing, per row, a chain copied from an earlier occurrence of the current suffix.

    Each step the row's sequence is its committed history followed by the root. The longest suffix n-gram
    (``max_ngram_size`` down to ``min_ngram_size`` tokens) that occurred earlier is located, most recent
    occurrence first, and the up to ``K`` tokens that followed it are proposed as a chain; a row with no match
    drafts nothing that step (its nodes are absent). Proposals are a deterministic function of the history,
    so the draft's scheme is ``DETERMINISTIC`` and verification is lossless for any sampling setting.

    Differences from HF's ``prompt_lookup_num_tokens``: HF takes the *first* occurrence (pass
    ``most_recent=False`` to match it) and its ``max_matching_ngram_size`` defaults to 2; it also cuts the
    proposal at EOS, which this drafter leaves to ``generate()``'s stopping rule.

    Args:
        max_ngram_size: longest suffix to match (3 in the original prompt lookup decoding).
        min_ngram_size: shortest suffix to match.
        num_drafts: ``K``, the longest chain proposed (``max_num_drafts``; a schedule may ask for fewer).
        most_recent: match the latest earlier occurrence (default) instead of the first.
        fixed_width: propose ``[B, K]`` drafts every step (a row's nodes past its proposal absent), so
            ``propose`` never synchronises with the host and its shapes never change (the fast path's buckets
            stay fixed). The emitted tokens are the same; the target verifies up to ``K`` absent nodes more per
            step. ``False`` (default): the draft is as wide as the longest proposal, found with a host sync.

    The tensor work of ``propose`` and ``update`` is also offered as :class:`~specdec.graphs.Step` s
    (``draft_step`` / ``absorb_step``), so :func:`specdec.graphs.cuda_graphed` captures them on CUDA: the history
    is then a preallocated buffer written in place (``start(static=True)``), searched whole under each row's
    length, so a step's shapes depend only on the batch size, the buffer and ``K``. Only ``fixed_width`` drafts
    are captured (the other kind reads its width on the host). A host-side bound of the row lengths decides when
    the history must grow (a non-blocking copy re-tightens it every 16 updates), so no step synchronises.

    References:
        Saxena, "Prompt Lookup Decoding" (2023), https://github.com/apoorvumang/prompt-lookup-decoding;
        HF ``PromptLookupCandidateGenerator``; vLLM's ``[ngram]`` speculator.
    """

    max_ngram_size: int = 3
    min_ngram_size: int = 1
    num_drafts: int = 10
    most_recent: bool = True
    fixed_width: bool = False

    feature_layers: ClassVar[tuple[int, ...]] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram_size <= self.max_ngram_size:
            raise ValueError(
                "need 1 <= min_ngram_size <= max_ngram_size, got "
                f"min_ngram_size={self.min_ngram_size}, max_ngram_size={self.max_ngram_size}"
            )
        if self.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1 (the longest chain to propose), got {self.num_drafts}")

    @property
    def max_num_drafts(self) -> int:
        """The largest ``K`` this drafter accepts (``num_drafts``)."""
        return self.num_drafts

    def start(self, feedback: Feedback, *, static: bool = False,
              buffers: torch.Tensor | None = None) -> PromptLookupState:
        """Record the prompt tokens of every row (left padding, marked invalid, is skipped).

        Args:
            feedback: the prompt's :class:`Feedback`; only ``tokens`` (shape ``[B, M]``) and ``valid`` (shape
                ``[B, M]``) are read.
            static: keep the history in a buffer meant to stay put (with headroom), written in place by ``update``
                (for :mod:`specdec.graphs`).
            buffers: with ``static``, the history buffer of an earlier run (``Step.buffers``), reused when it has
                the batch size, the device and room for the prompt.

        Returns:
            A :class:`PromptLookupState` holding each row's valid prompt tokens.
        """
        batch, width = feedback.tokens.shape
        device = feedback.tokens.device
        need = width + self.num_drafts + 1 + _SPARE  # the prompt and the first step's feedback
        if (static and isinstance(buffers, torch.Tensor) and buffers.shape[0] == batch and buffers.shape[1] >= need
                and buffers.device == device):
            history = buffers
        else:
            history = torch.zeros((batch, _capacity(need - _SPARE, static)), dtype=torch.long, device=device)
        empty = PromptLookupState(history, torch.zeros(batch, dtype=torch.long, device=device), 0, static)
        return run_step(self.absorb_step(empty, feedback))

    def update(self, state: PromptLookupState, feedback: Feedback) -> PromptLookupState:
        """Append each row's newly committed tokens (the root and its accepted drafts) to the history.

        Args:
            state: the state from ``start`` or the previous ``update``.
            feedback: the step's :class:`Feedback`; ``tokens`` and ``valid`` (shape ``[B, M]``) are read.

        Returns:
            The new :class:`PromptLookupState` (``state`` is not modified, unless it is static: then its history
            buffer is written in place and the new state must be used instead).
        """
        return run_step(self.absorb_step(state, feedback))

    def propose(self, state: PromptLookupState, request: ProposeRequest) -> tuple[Draft, PromptLookupState]:
        """Propose each row's n-gram continuation as a chain of at most ``request.num_drafts`` tokens.

        Args:
            state: the current :class:`PromptLookupState`.
            request: the step's :class:`ProposeRequest`; reads ``roots`` (shape ``[B]``), ``num_drafts`` and
                ``active`` (shape ``[B]``; inactive rows draft nothing).

        Returns:
            ``(draft, state)``: a chain :class:`Draft` with ``tokens`` of shape ``[B, k]`` where ``k`` is the
            longest proposal in the batch, or ``K`` with ``fixed_width`` (node ``i`` has parent ``i - 1`` and
            depth ``i``; a row's nodes past its own proposal are absent: parent ``-1``, depth 0),
            ``draft_probs=None`` and scheme ``DETERMINISTIC``; and the unchanged state.
        """
        return run_step(self.draft_step(state, request))

    def for_fast_path(self) -> PromptLookupDrafter:
        """The drafter ``generate(fast=True)`` graphs in this one's place: a ``fixed_width`` copy (the same tokens and
        target forwards; a lookup whose width is read on the host would run eagerly and synchronise every step)."""
        return self if self.fixed_width else dataclasses.replace(self, fixed_width=True)

    @property
    def folds_drafts(self) -> bool:
        """Whether :class:`~specdec.graphs.GraphedDrafter` may run the update and the next draft inside the fast
        path's verify step (:meth:`~specdec.graphs.GraphedDrafter.fold_for`): a ``fixed_width`` draft step reads of
        a request only ``num_drafts``, ``roots`` and ``active`` (a folded request has no ``active``: every row
        drafts; a finished row commits nothing either way)."""
        return self.fixed_width

    # ---- the steps (specdec.graphs captures them) ------------------------------------------------------

    def draft_step(self, state: PromptLookupState, request: ProposeRequest) -> Step:
        """:meth:`propose` as a :class:`~specdec.graphs.Step`: inputs ``(lengths [B], roots [B], active [B])``.

        Args:
            state: the current state.
            request: the step's request.

        Returns:
            A step whose ``finish`` returns ``(draft, state)``; its key is ``("propose", K)`` for a static
            ``fixed_width`` state, else ``None`` (run eagerly: the width is read on the host).

        Raises:
            ValueError: ``K`` outside ``1..num_drafts``, or ``roots`` not one per row.
        """
        k = request.num_drafts
        if not 1 <= k <= self.num_drafts:
            raise ValueError(
                f"num_drafts={k} is outside 1..{self.num_drafts} for this PromptLookupDrafter; lower the "
                f"schedule's K or build the drafter with num_drafts >= {k} (K = 0 steps skip the drafter)"
            )
        history, fixed = state.history, self.fixed_width
        batch = history.shape[0]
        roots = request.roots.to(device=history.device, dtype=torch.long)
        if roots.shape != (batch,):
            raise ValueError(f"roots must have shape [{batch}] (one per row), got {tuple(roots.shape)}")
        # a folded request has none (the fast path's fold drafts ahead for every row; finished rows commit nothing)
        active = None if request.active is None else request.active.to(device=history.device, dtype=torch.bool)

        def draft(lengths: torch.Tensor, roots: torch.Tensor, active: torch.Tensor | None):
            # the search and the chain, one launch on CUDA (room for the root: see _capacity)
            chain = ngram_chain(history, lengths, roots, k, self.max_ngram_size, self.min_ngram_size,
                                most_recent=self.most_recent, active=active)
            return _as_draft(chain) if fixed else chain

        def finish(out) -> tuple[Draft, PromptLookupState]:
            if fixed:
                return out, state
            width = int(out.counts.max()) if batch else 0  # host sync: the longest proposal sizes the draft
            return _as_draft(chain_layout(out.tokens[:, :width], out.counts)), state

        return Step(fn=draft, inputs=(state.lengths, roots, active), finish=finish,
                    key=("propose", k) if fixed and state.static else None, buffers=history if state.static else ())

    def absorb_step(self, state: PromptLookupState, feedback: Feedback) -> Step:
        """:meth:`update` as a :class:`~specdec.graphs.Step`: inputs ``(lengths [B], tokens [B, M], valid [B, M])``.

        Args:
            state: the current state (its history grows first where the bound says it must).
            feedback: the committed entries.

        Returns:
            A step whose ``finish`` returns the new state; its key is ``("update",)`` for a static state and a
            step's feedback (at most ``num_drafts + 1`` entries), else ``None``.

        Raises:
            ValueError: the feedback's batch size is not the state's.
        """
        batch, width = feedback.tokens.shape
        if batch != state.history.shape[0]:
            raise ValueError(
                f"feedback has {batch} rows but the state has {state.history.shape[0]}; "
                "call start() again when the batch changes"
            )
        state = _room_for(state, width)
        history, static = state.history, state.static

        def absorb(lengths: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor):
            if static:
                return _write(history, lengths, tokens, valid)
            grown = history.clone()  # a new state; the old one stays as it was
            return _write(grown, lengths, tokens, valid), grown

        def finish(out) -> PromptLookupState:
            lengths, kept = (out, history) if static else out
            bound = state.bound + width  # at most ``width`` entries per row
            since, mark = state.since_resync + 1, state.mark
            if since >= _RESYNC_EVERY and mark is None:  # re-tightened once the copy has arrived
                mark, since = mark_bound(lengths, bound), 0
            return PromptLookupState(kept, lengths, bound, static, since, mark)

        key = ("update",) if static and width <= self.num_drafts + 1 else None
        return Step(fn=absorb, inputs=(state.lengths, feedback.tokens, feedback.valid), finish=finish, key=key,
                    buffers=history if static else ())


def _room_for(state: PromptLookupState, width: int) -> PromptLookupState:
    """``state`` with its bound tightened (without waiting) and its history grown, if need be, so that ``width``
    more entries per row and the draft step's root fit. Only a history about to grow waits for the bound's copy,
    then reads the lengths (a host sync, as rare as the growth)."""
    if state.bound is None:  # a state built by hand: learn its bound (one sync)
        state = state._replace(bound=int(state.lengths.max()) if state.lengths.numel() else 0, mark=None)
    columns = state.history.shape[1]
    for wait in (False, True):
        bound, mark = settle_bound(state.bound, state.mark, wait=wait)
        state = state._replace(bound=bound, mark=mark)
        if bound + width + _SPARE <= columns:
            return state
    exact = int(state.lengths.max()) if state.lengths.numel() else 0
    state = state._replace(bound=exact, since_resync=0)
    if exact + width + _SPARE <= columns:
        return state
    grown = state.history.new_zeros((state.history.shape[0], _capacity(max(exact + width, 2 * columns), state.static)))
    grown[:, :exact] = state.history[:, :exact]
    return state._replace(history=grown)


def _as_draft(chain: NgramChain) -> Draft:
    """The chain :class:`Draft` of an :class:`~specdec.kernels.NgramChain` (absent nodes after each row's count)."""
    return Draft(tokens=chain.tokens, parents=chain.parents, depths=chain.depths, draft_probs=None,
                 scheme=DraftScheme.DETERMINISTIC)
