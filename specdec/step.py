"""One decoding step as a function: typed inputs in, typed outputs out (draft, target forward, verify, keep, update).

``generate()`` is a loop around :func:`step`; the same two functions drive decoding by hand, e.g. in a notebook::

    adapter = ModelAdapter(model, drafter.feature_layers)
    out = prefill(adapter, input_ids, attention_mask, drafter=drafter, sampling=SamplingParams())
    for _ in range(8):
        out = step(adapter, out.state, drafter=drafter, num_drafts=4, sampling=SamplingParams())
        print(out.emitted)                      # per row: the accepted drafts, then the next token

A step with drafts runs the tree path: propose, one target forward over ``[root] + drafts`` under the tree mask,
verify, keep the accepted path in the cache, tell the drafter. A step without drafts (``num_drafts=0``, no
drafter, or a drafter that proposed nothing) is HF's own one-token decode: one forward of the root on the cache
with the mask HF would build, the argmax (or a draw), and the token stays in the cache; no tree mask, no verifier,
no compaction.

A step *consumes* its input state (the KV caches are updated in place, see :class:`~specdec.adapter.CacheState`):
continue from ``out.state``. Randomness comes from one :class:`~specdec.sampling.RandomSource`, which drives the
drafter and the verifier alike, so pre-drawn noise (:class:`~specdec.sampling.PredrawnNoise`) replays a whole step.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from .adapter import CacheState, ModelAdapter
from .drafters.base import Drafter, Feedback, ProposeRequest
from .gating import truncate_draft
from .kernels import accepted_feedback, packed_tokens, sanitised_ids
from .sampling import RandomSource, as_source, next_token
from .types import Draft, SamplingParams, VerifyResult
from .verify import Verifier, as_verifier, emitted_tokens, select_verifier, verifier_input

__all__ = ["DecodeState", "StepOutput", "LateTokens", "prefill", "step"]

GREEDY = SamplingParams()


class DecodeState(NamedTuple):
    """What carries from one step to the next.

    Attributes:
        cache: the target's :class:`~specdec.adapter.CacheState` (consumed by the next step).
        roots: Shape ``[B]`` int64, each row's last emitted token, which the target has not run yet (the next
            step's root, node 0 of its tree).
        drafter_state: the drafter's state (``None`` without a drafter).
    """

    cache: CacheState
    roots: torch.Tensor
    drafter_state: Any = None


class LateTokens(Sequence):
    """A step's tokens whose copy to the host is under way (``step(..., sync=False)``).

    The copy is queued behind the step's kernels (non-blocking, with an event), so the host can queue the next step
    before reading it. Reading it (:meth:`wait`, indexing, iterating) waits for the copy, not for later work.
    :class:`specdec.rows.Rows` reads it one step late. A plain step's (``LateTokens(tokens)``) has one token per
    row, so ``lengths`` is known at once; a tree step's (:meth:`of_rows`) has between 1 and ``max_length`` per
    row, known when read.

    Args:
        tokens: Shape ``[B]`` int64, each row's next token, on any device.

    Attributes:
        lengths: ``[1] * B`` for a plain step's tokens; ``None`` until read for a tree step's.
        max_length: the most tokens a row may hold (1 for a plain step).
    """

    def __init__(self, tokens: torch.Tensor, *, _read: Callable[[list[list[int]]], list[list[int]]] | None = None,
                 _max_length: int = 1):
        self.lengths = [1] * tokens.shape[0] if _read is None else None
        self.max_length = _max_length
        self._read = _read
        self._rows: list[list[int]] | None = None
        self._event = None
        if tokens.is_cuda:
            self._host = tokens.to("cpu", non_blocking=True)  # pinned by torch for a non-blocking copy
            self._event = torch.cuda.Event()
            self._event.record()
        else:  # a copy, as on CUDA: the tensor may be a captured step's output, which its next replay overwrites
            self._host = tokens.to("cpu", copy=True)

    @classmethod
    def of_rows(cls, packed: torch.Tensor, read: Callable[[list[list[int]]], list[list[int]]],
                max_length: int) -> LateTokens:
        """A tree step's tokens: ``packed`` (Shape ``[B, C]`` int64, on any device) is copied to the host now and
        turned into the per-row lists by ``read(rows of packed)`` when first used (``read`` may raise)."""
        return cls(packed, _read=read, _max_length=max_length)

    def wait(self) -> list[list[int]]:
        """Per row, its tokens (waits for the copy once)."""
        if self._rows is None:
            if self._event is not None:
                self._event.synchronize()
            host = self._host.tolist()
            self._rows = [[t] for t in host] if self._read is None else self._read(host)
            self.lengths = [len(r) for r in self._rows]
        return self._rows

    def __getitem__(self, row):
        return self.wait()[row]

    def __len__(self) -> int:
        return len(self.lengths)


class StepOutput(NamedTuple):
    """What one step (or the prefill) produced.

    Attributes:
        emitted: per row, the tokens this step emitted, on the host (the step's one host sync): the accepted
            drafts, then the next token (bonus or recovered). Rows marked inactive get tokens too, but nothing of
            theirs was committed: ignore them. A plain step run with ``sync=False`` returns a
            :class:`LateTokens` (the same per-row lists, read when first used).
        state: the :class:`DecodeState` to continue from.
        draft: the verified :class:`~specdec.types.Draft` (``None`` for a step without drafts).
        result: the :class:`~specdec.types.VerifyResult` (``None`` for a step without drafts).
    """

    emitted: list[list[int]]
    state: DecodeState
    draft: Draft | None = None
    result: VerifyResult | None = None


def _tick(clock: Callable[[str], None] | None, phase: str) -> None:
    if clock is not None:
        clock(phase)


@torch.no_grad()
def prefill(adapter: ModelAdapter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
            drafter: Drafter | None = None, sampling: SamplingParams = GREEDY,
            source: RandomSource | None = None) -> StepOutput:
    """Step 0: the target runs the prompts; its last logits give each row's first token (the first root).

    Args:
        adapter: the target's :class:`~specdec.adapter.ModelAdapter` (with the drafter's ``feature_layers``).
        input_ids: Shape ``[B, T]``, left-padded prompts.
        attention_mask: Shape ``[B, T]``, 1 for real tokens (``None``: no padding).
        drafter: a :class:`~specdec.drafters.Drafter`, started on the prompt's target pass (or ``None``).
        sampling: temperature / top-k / top-p (greedy by default).
        source: the randomness (required when sampling).

    Returns:
        :class:`StepOutput` whose ``emitted`` holds each row's first token.
    """
    out, cache = adapter.prefill(input_ids, attention_mask)
    roots = next_token(out.logits[:, -1], sampling, source)
    drafter_state = None
    if drafter is not None:
        valid = cache.committed_valid
        drafter_state = drafter.start(Feedback(
            tokens=input_ids, next_tokens=torch.cat([input_ids[:, 1:], roots[:, None]], 1),
            positions=(valid.long().cumsum(1) - 1).clamp_(min=0), valid=valid, features=out.features, roots=roots))
    # Host sync: the first token of every row.
    emitted = [[t] for t in roots.tolist()]
    return StepOutput(emitted=emitted, state=DecodeState(cache=cache, roots=roots, drafter_state=drafter_state))


@torch.no_grad()
def step(adapter: ModelAdapter, state: DecodeState, *, drafter: Drafter | None = None, num_drafts: int = 0,
         sampling: SamplingParams = GREEDY, source: RandomSource | None = None,
         active: torch.Tensor | None = None, verifier: Verifier | None = None,
         clock: Callable[[str], None] | None = None, sync: bool = True,
         max_depth: int | torch.Tensor | None = None) -> StepOutput:
    """One decoding step: draft, run the target, verify, keep the accepted path, tell the drafter.

    Math (per row; accepted / bonus / recovered as in vLLM's rejection sampler): the row emits its accepted
    drafts, then the next token (the bonus token when the accepted path has no child left to try, else the
    recovered token); with a lossless verifier the emitted tokens follow the target's law exactly. Without
    drafts the row emits one token, the argmax or a draw from ``process_logits(target logits, sampling)``.

    Args:
        adapter: the target's :class:`~specdec.adapter.ModelAdapter`.
        state: the :class:`DecodeState` from :func:`prefill` or the previous step (consumed).
        drafter: the :class:`~specdec.drafters.Drafter` (``None``: a plain step).
        num_drafts: ``K``, the depth bound of this step's draft (``0``: a plain step, the drafter only learns
            the new token).
        sampling: temperature / top-k / top-p, applied identically to target and draft.
        source: the randomness of drafting and verification (required when sampling).
        active: Shape ``[B]`` bool, rows still generating (``None``: all). Inactive rows commit nothing in a
            step with drafts; in a plain step every row keeps its token, as in HF.
        verifier: a :class:`~specdec.verify.Verifier` for steps with drafts (default: the lossless one exact
            for the draft's scheme, or greedy; other functions are normalised by
            :func:`~specdec.verify.as_verifier`). Steps without drafts never call a verifier.
        clock: called with a phase name (``draft``, ``target``, ``verify``, ``commit``, ``update``) at the end of
            each phase, for profiling (see :class:`~specdec.stats.PhaseClock`).
        sync: ``False`` lets the step return without a host sync: its ``emitted`` is a :class:`LateTokens`. A step
            without drafts can always do so; a step with drafts only on an adapter that commits late (the fast
            path's :class:`~specdec.static.StaticAdapter`): each row's accepted path moves to the row's own end of
            the cache and the drafter is told ``K + 1`` columns, the unaccepted ones marked invalid. A drafter's
            out-of-vocabulary id is then reported when the tokens are read, one step later.
        max_depth: verify no deeper than this (``None``: ``num_drafts``), or per row (Shape ``[B]`` int64 on the
            device, no host sync): the draft of ``num_drafts`` levels is cut with
            :func:`specdec.gating.truncate_draft` (lossless: it only removes nodes), so a drafter keeps one shape
            when a budget leaves room for fewer tokens.

    Returns:
        :class:`StepOutput`.

    Raises:
        ValueError: the drafter proposed a token id outside the target's vocabulary at a present node (found
            without an extra host sync, at the step's own sync, before anything is committed).

    Example:
        >>> out = step(adapter, out.state, drafter=drafter, num_drafts=4)      # doctest: +SKIP
        >>> out.emitted                                                         # doctest: +SKIP
        [[17, 4, 99]]
    """
    source = as_source(source, greedy=sampling.is_greedy)
    draft, drafter_state = None, state.drafter_state
    if drafter is not None and num_drafts > 0:
        # 1. Draft: a tree per row (a chain is a tree), from the same randomness as the verifier.
        draft, drafter_state = drafter.propose(drafter_state, ProposeRequest(
            roots=state.roots, root_positions=state.cache.lengths, num_drafts=num_drafts, sampling=sampling,
            source=source, active=_all_rows(state.roots) if active is None else active,
            vocab_size=adapter.vocab_size))
        if isinstance(max_depth, torch.Tensor):
            draft = truncate_draft(draft, max_depth)
        elif max_depth is not None and max_depth < num_drafts:
            draft = truncate_draft(draft, torch.full_like(state.roots, max_depth))
        _tick(clock, "draft")
    if draft is None or draft.num_nodes == 0:
        return _plain(adapter, state._replace(drafter_state=drafter_state), drafter, sampling, source, active, clock,
                      sync)
    return _tree(adapter, state._replace(drafter_state=drafter_state), draft, num_drafts, drafter, sampling,
                 source, active, verifier, clock, late=not sync and getattr(adapter, "commits_late", False))


_ALL_ROWS: dict = {}  # (batch, device) -> (the all-True mask, its version when made)


def _all_rows(roots: torch.Tensor) -> torch.Tensor:
    """Shape ``[B]`` bool, all True: every row active. The same tensor at every step while nothing wrote it (its
    version counter), so a captured step that copies it in can see that it did not change (no launch at all)."""
    key = (roots.shape[0], roots.device)
    held = _ALL_ROWS.get(key)
    try:
        if held is not None and held[0]._version == held[1]:
            return held[0]
        mask = torch.ones_like(roots, dtype=torch.bool)
        _ALL_ROWS[key] = (mask, mask._version)
    except RuntimeError:  # an inference tensor keeps no version counter: a new one each time
        return torch.ones_like(roots, dtype=torch.bool)
    return mask


def _plain(adapter, state: DecodeState, drafter, sampling, source, active, clock, sync: bool = True) -> StepOutput:
    """A step without drafts: HF's one-token decode, the token kept at once."""
    # 2. Target forward of each root on the cache, with the mask HF would build (none without padding).
    # 3. Nothing to verify: the next token is the argmax, or a draw from the processed target law. (The fast path
    # takes the argmax inside its captured forward: the same op on the same logits.)
    decode_argmax = getattr(adapter, "decode_argmax", None) if sampling.is_greedy else None
    if decode_argmax is not None:
        out, cache, next_tokens = decode_argmax(state.cache, state.roots)
        _tick(clock, "target")
    else:
        out, cache = adapter.decode(state.cache, state.roots)
        _tick(clock, "target")
        next_tokens = next_token(out.logits[:, -1], sampling, source)
    _tick(clock, "verify")
    drafter_state = state.drafter_state
    if drafter is not None:
        # 4. The drafter learns the root (now committed), its features and the new root; the root (node 0) is
        # the whole accepted path.
        valid = _all_rows(next_tokens)[:, None] if active is None else active[:, None]
        drafter_state = drafter.update(drafter_state, Feedback(
            tokens=state.roots[:, None], next_tokens=next_tokens[:, None], positions=state.cache.lengths[:, None],
            valid=valid, features=out.features, roots=next_tokens,
            accepted_nodes=torch.zeros_like(valid, dtype=torch.long)))
        _tick(clock, "update")
    # The step's one host sync: the token each row emitted (the row bookkeeping needs it); or none, the copy left
    # under way for the caller to read after queueing the next step.
    emitted = [[t] for t in next_tokens.tolist()] if sync else LateTokens(next_tokens)
    return StepOutput(emitted=emitted, state=DecodeState(cache=cache, roots=next_tokens, drafter_state=drafter_state))


def _tree(adapter, state: DecodeState, draft: Draft, num_drafts: int, drafter, sampling, source, active,
          verifier, clock, late: bool = False) -> StepOutput:
    """A step with drafts: the tree path (``late``: without a host sync, see :func:`step`)."""
    roots, cache = state.roots, state.cache
    captured = late and verifier is None and sampling.is_greedy and hasattr(adapter, "forward_commit")
    # A drafter bug must not reach the embedding (a device-side assert on CUDA): clamp the ids and remember the
    # bad nodes; the first one is reported at the step's host sync below (the captured step does both inside).
    bad = None
    if not captured:
        draft, bad = _sanitised(draft, adapter.vocab_size)
    # 2. Target forward over [root] + drafts under the tree mask, positions = prefix length + depth.
    nodes, positions = torch.cat([roots[:, None], draft.tokens], 1), cache.lengths[:, None] + draft.depths
    if captured:
        # 2-4 as one captured step on the fast path: mask, forward, greedy verify, emitted tokens, feedback rows, keep.
        return _tree_captured(adapter, state, draft, nodes, positions, num_drafts, drafter, active, clock)
    present = draft.parents >= 0
    present[:, 0] = True  # the root (parent -1) is always there; other nodes with parent -1 are absent
    out, pending = adapter.forward(cache, nodes, draft.parents, positions, present)
    _tick(clock, "target")
    # 3. Verify: every verifier is called the same way; drafts are never deeper than K (no sync for the depth).
    verifier = select_verifier(draft.scheme, sampling) if verifier is None else as_verifier(verifier)
    result = verifier(verifier_input(verifier, out.logits, sampling), draft, source, max_depth=num_drafts)
    tokens, counts = emitted_tokens(draft, result)  # [B, K + 1] (-1 after counts), [B]
    path = result.accepted_nodes  # [B, K + 1], pending indices of the root and the accepted drafts
    if late:
        return _tree_late(adapter, state, out, pending, draft, result, tokens, counts, bad, drafter, active, clock)
    live = _all_rows(roots) if active is None else active
    # The step's one host sync, per row: emitted count, active, accepted path, tokens, then the bad-id flags.
    host = torch.cat([counts[:, None], live.long()[:, None], path, tokens] + ([bad.long()] if bad is not None else []),
                     1).tolist()
    _tick(clock, "verify")
    D1 = path.shape[1]
    _raise_on_bad_ids(host, drafter, 2 + 2 * D1)
    kept = [row[0] if row[1] else 0 for row in host]  # tokens each row commits: root + accepted drafts
    width = max(kept)
    # 4. Keep each row's accepted path (root + accepted drafts) in the cache; inactive rows keep nothing.
    keep_counts = counts if active is None else counts * active
    nodes = path[:, :width]
    cache = adapter.commit(pending, nodes, keep_counts,
                           prefix=all(row[2:2 + n] == list(range(n)) for row, n in zip(host, kept)),
                           full=all(n == width for n in kept))
    _tick(clock, "commit")
    emitted = [row[2 + D1:2 + D1 + row[0]] for row in host]
    drafter_state = state.drafter_state
    if drafter is not None:
        # 5. The drafter absorbs the outcome: the committed tokens and the target's features at them.
        # (kernels.accepted_feedback, one launch: root + accepted drafts, the tokens after them, positions, valid
        # columns, and every feature layer at the accepted nodes)
        rows = accepted_feedback(roots, tokens, keep_counts, pending.lengths, width, out.features, nodes)
        drafter_state = drafter.update(drafter_state, _feedback(rows, result.next_tokens, nodes))
        _tick(clock, "update")
    state = DecodeState(cache=cache, roots=result.next_tokens, drafter_state=drafter_state)
    return StepOutput(emitted=emitted, state=state, draft=draft, result=result)


def _tree_late(adapter, state: DecodeState, out, pending, draft: Draft, result: VerifyResult, tokens: torch.Tensor,
               counts: torch.Tensor, bad: torch.Tensor | None, drafter, active, clock) -> StepOutput:
    """The tree path's keep and update without the counts on the host: every width is the path's, ``K + 1``."""
    _tick(clock, "verify")
    D1 = min(result.accepted_nodes.shape[1], pending.num_pending)  # a path holds at most every pending node
    path = result.accepted_nodes[:, :D1]
    keep_counts = counts if active is None else counts * active
    # 4. Each row's accepted path moves to the row's own end of the cache (no host sync: see StaticAdapter.commit).
    cache = adapter.commit(pending, path, keep_counts, late=True)
    _tick(clock, "commit")
    rows = None
    if drafter is not None:
        # 5. The drafter absorbs K + 1 columns; those past a row's count are marked invalid.
        rows = accepted_feedback(state.roots, tokens, keep_counts, pending.lengths, D1, out.features, path)
    return _late_output(state, cache, draft, result, path, tokens, counts, rows, bad, drafter, clock)


def _greedy_decision(verifier, num_drafts: int, scheme, vocab: int | None) -> Callable:
    """What the fast path's captured step runs after the target's forward of ``[root] + drafts`` when greedy: the
    draft ids clamped into ``[0, V)`` with the bad ones flagged (:func:`_sanitised`; the adapter clamps what the
    model reads), the verification, the emitted tokens and the drafter's feedback rows, as :func:`_tree` and
    :func:`_tree_late` do (see :meth:`specdec.static.StaticAdapter.forward_commit` for the signature)."""

    def decide(logits, features, nodes, positions, parents, active):
        draft = Draft(tokens=nodes[:, 1:], parents=parents, depths=positions - positions[:, :1], draft_probs=None,
                      scheme=scheme)
        draft, bad = _sanitised(draft, vocab)
        result = verifier(logits, draft, None, max_depth=num_drafts)  # greedy verifiers take raw logits
        tokens, counts = emitted_tokens(draft, result)
        keep_counts = counts * active
        D1 = min(result.accepted_nodes.shape[1], nodes.shape[1])
        path = result.accepted_nodes[:, :D1]
        rows = accepted_feedback(nodes[:, 0], tokens, keep_counts, positions[:, 0], D1, features, path)
        return path, keep_counts, (result, tokens, counts, rows, path, bad, _packed(counts, tokens, bad))
    return decide


def _tree_captured(adapter, state: DecodeState, draft: Draft, nodes, positions, num_drafts: int, drafter, active,
                   clock) -> StepOutput:
    """:func:`_tree_late` for a greedy step on an adapter with ``forward_commit``: the ids' check, forward, verify,
    emitted tokens, feedback rows and the late commit replay as one captured step (identical results, fewer
    launches). A graphed drafter that drafts ahead adds its update and next draft to that step
    (:meth:`specdec.graphs.GraphedDrafter.fold_for`): then the drafter is not called after it."""
    verifier = select_verifier(draft.scheme, GREEDY)
    live = _all_rows(state.roots) if active is None else active
    vocab = adapter.vocab_size
    decide = _greedy_decision(verifier, num_drafts, draft.scheme, vocab)
    extra, key = (live,), ("greedy", verifier, num_drafts, draft.scheme, vocab)  # decide gets the parents first
    # A graphed drafter that drafts ahead may run its update and next draft inside the same capture (one replay).
    fold_for = getattr(drafter, "fold_for", None)
    fold = fold_for(state.drafter_state, num_drafts, nodes.device) if fold_for is not None else None
    if fold is not None:
        decide, extra, key = _folded(decide, fold.run), extra + fold.extra, key + (fold.key,)
    # present=None: the root and every node with a parent (step()'s convention), found inside the captured step
    outputs, cache = adapter.forward_commit(state.cache, nodes, draft.parents, positions, None, decide, extra, key)
    outputs, folded = outputs if fold is not None else (outputs, None)
    result, tokens, counts, rows, path, bad, packed = outputs  # packed: the tokens for the host, made in the graph
    for phase in ("target", "verify", "commit"):
        _tick(clock, phase)
    # The captured step's outputs are overwritten by its next replay: the new roots outlive it.
    result = result._replace(next_tokens=result.next_tokens.clone())
    if fold is not None:
        drafter_state = fold.finish(folded, result.next_tokens, cache.lengths)
        return _late_output(state, cache, draft, result, path, tokens, counts, None, bad, drafter, clock,
                            drafter_state, packed)
    copies = getattr(drafter, "copies_feedback", None)
    if drafter is not None and not (copies is not None and copies(tokens.device)):
        rows = type(rows)(*(tuple(t.clone() for t in f) if isinstance(f, tuple) else f.clone() for f in rows))
    return _late_output(state, cache, draft, result, path, tokens, counts, rows, bad, drafter, clock,
                        packed=packed)


def _feedback(rows, roots: torch.Tensor, path: torch.Tensor) -> Feedback:
    """What the drafter absorbs after a late step: the feedback rows (``kernels.accepted_feedback``), the new
    roots and the accepted path."""
    return Feedback(tokens=rows.committed, next_tokens=rows.next_tokens, positions=rows.positions, valid=rows.valid,
                    features=rows.features, roots=roots, accepted_nodes=path)


def _folded(decide: Callable, run: Callable) -> Callable:
    """``decide`` followed, inside the same capture, by a drafter's folded update and next draft
    (:meth:`specdec.graphs.GraphedDrafter.fold_for`) on the feedback it made; ``extra`` past ``decide``'s own are
    the drafter's state tensors."""
    def decide_and_fold(logits, features, nodes, positions, parents, active, *state):
        keep, keep_counts, outputs = decide(logits, features, nodes, positions, parents, active)
        result, _, _, rows, path, _, _ = outputs
        lengths = positions[:, 0] + keep_counts  # each row's length after the commit: the next roots' positions
        return keep, keep_counts, (outputs, run(_feedback(rows, result.next_tokens, path), lengths, *state))
    return decide_and_fold


def _packed(counts: torch.Tensor, tokens: torch.Tensor, bad: torch.Tensor | None) -> torch.Tensor:
    """What a late tree step copies to the host: per row its count, its tokens, then the bad-id flags
    (``[B, 1 + (K + 1) + N]`` int64; the flags only with a known vocabulary)."""
    return packed_tokens(counts, tokens, bad)


def _late_output(state: DecodeState, cache, draft: Draft, result: VerifyResult, path: torch.Tensor,
                 tokens: torch.Tensor, counts: torch.Tensor, rows, bad: torch.Tensor | None, drafter, clock,
                 folded_state: Any = None, packed: torch.Tensor | None = None) -> StepOutput:
    """A late tree step's end: the drafter absorbs ``rows`` (unless its update ran folded into the step: then
    ``folded_state`` is its new state), and the tokens start their way to the host (``packed``, :func:`_packed`'s
    tensor when the captured step made it already)."""
    drafter_state = state.drafter_state
    if folded_state is not None:
        drafter_state = folded_state
        _tick(clock, "update")
    elif drafter is not None:
        drafter_state = drafter.update(drafter_state, _feedback(rows, result.next_tokens, path))
        _tick(clock, "update")
    # The tokens on their way to the host: per row its count, its tokens, then the bad-id flags (read one step late).
    packed = _packed(counts, tokens, bad) if packed is None else packed
    T, D1 = tokens.shape[1], path.shape[1]

    def read(host: list[list[int]]) -> list[list[int]]:
        _raise_on_bad_ids([[0, 0] + row[1 + T:] for row in host], drafter, 2)
        return [row[1:1 + row[0]] for row in host]

    emitted = LateTokens.of_rows(packed, read, D1)
    return StepOutput(emitted=emitted, state=DecodeState(cache=cache, roots=result.next_tokens,
                                                         drafter_state=drafter_state), draft=draft, result=result)


def _sanitised(draft: Draft, vocab: int | None) -> tuple[Draft, torch.Tensor | None]:
    """The draft with ids clamped into ``[0, V)``, and which present drafts held an id outside it (``[B, N]`` bool;
    ``None`` without a known vocabulary)."""
    if vocab is None:
        return draft, None
    tokens, bad = sanitised_ids(draft.tokens, draft.parents, vocab)  # one launch on CUDA
    return draft._replace(tokens=tokens), bad


def _raise_on_bad_ids(host: list[list[int]], drafter, start: int) -> None:
    """Raise on the first row whose bad-id flags (``row[start:]``, one per draft node) hold a 1."""
    name = type(getattr(drafter, "drafter", drafter)).__name__  # a graphed drafter: the one it wraps
    for row, values in enumerate(host):
        flags = values[start:]
        if 1 in flags:
            node = flags.index(1) + 1
            raise ValueError(
                f"{name} proposed a token id outside the target's vocabulary at row {row}, node "
                f"{node} (a present node): draft ids must lie in [0, V) with V the target's vocabulary; mark padding "
                f"nodes absent (parent -1, depth 0) instead of giving them id -1")
