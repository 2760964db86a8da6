"""The EAGLE drafter: an autoregressive feature-level head (EAGLE-1 / EAGLE-3) driven by a tree policy.

:class:`EagleDrafter` implements the :class:`~specdec.drafters.Drafter` protocol around an
:class:`~specdec.heads.Eagle1Head` or :class:`~specdec.heads.Eagle3Head`, with any tree policy of
:mod:`specdec.trees` (``StaticTree``, ``SampledTree``, ``DynamicTree``). The methods are recipes in
:mod:`specdec.recipes` (``eagle1``, ``eagle2``, ``eagle3``).

The head's KV cache, per row (slot = position of the feature, so rows stay aligned without compaction)::

    [ committed entries 0..len_b-1 | stale (masked) .. bound | free ... | tree scratch | trash slot ]

``update`` runs the head once over the newly committed entries (root + accepted drafts), writing their keys
at their positions; the output at the last one is the root's hidden state, whose logits give level 1.
``propose`` then runs one forward per further level over that level's expanded nodes, writing their keys
into the scratch region at the end of the cache (never into the committed part, so rejected branches leave
no trace). Every forward attends over the whole cache under a mask, so a step's shapes depend only on the
batch size, the capacity and the depth: on CUDA, ``propose`` and ``update`` are captured once per shape as
CUDA graphs and replayed (``cuda_graphs``), which removes the launch overhead of ~100 small kernels per level.
``bound`` is a host-side upper bound of the row lengths, advanced by the feedback width, so no step needs a
host-device sync (one deliberate sync every ``resync_every`` updates re-tightens it).

References:
    EAGLE arXiv 2401.15077; EAGLE-2 arXiv 2406.16858; EAGLE-3 arXiv 2503.01840.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..heads.eagle import Eagle1Head, Eagle3Head, HeadCache
from ..trees.static import as_policy
from ..types import Draft, DraftScheme
from .base import Feedback, ProposeRequest

__all__ = ["EagleDrafter", "EagleState"]


# --------------------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------------------


class EagleState(NamedTuple):
    """What an :class:`EagleDrafter` carries between steps.

    Attributes:
        cache: the head's KV cache (written in place: a state is consumed by the next call, not reused).
        lengths: Shape ``[B]`` int64, committed entries per row (= the root's position).
        bound: host-side upper bound of ``lengths`` (decides when the cache must grow; no sync needed).
        last_hidden: Shape ``[B, H]``, the head's output at the last committed entry (predicts level 1).
        num_forwards: head forwards so far (read by ``generate()``'s statistics).
        since_resync: updates since ``bound`` was last re-tightened.
    """

    cache: HeadCache
    lengths: torch.Tensor
    bound: int
    last_hidden: torch.Tensor
    num_forwards: int
    since_resync: int


def _round_up(n: int, m: int = 64) -> int:
    return (n + m - 1) // m * m


class EagleDrafter:
    """Drafter for the EAGLE family: an EAGLE head plus a tree policy.

    Args:
        head: an :class:`~specdec.heads.Eagle1Head` or :class:`~specdec.heads.Eagle3Head` (on the target's
            device).
        tree: the tree policy: :class:`~specdec.trees.DynamicTree` (default ``DynamicTree()``: EAGLE-2),
            :class:`StaticTree` / a compiled tree / tree choices (EAGLE-1), or :class:`SampledTree`.
        resync_every: updates between the deliberate host syncs that re-tighten the cache bound.
        cuda_graphs: on CUDA, capture ``propose`` as a CUDA graph per (batch size, depth), and ``update`` per
            batch size, and replay them (a sampled tree at T > 0 drafts eagerly: its draws are not captured).
            The drafter then keeps one cache buffer that each :meth:`start` hands out again, so a drafter
            serves one ``generate()`` at a time (as its states are consumed in order anyway). ``False``: eager.

    Attributes:
        max_num_drafts: the policy's depth (a step's ``K`` prunes the tree to depth ``K``).
        feature_layers: the head's target layers.
        vocab_size: the target vocabulary the head was made for.

    Example:
        >>> drafter = EagleDrafter(Eagle1Head.from_target(model), DynamicTree(60, 6, 10))  # doctest: +SKIP
        >>> out = specdec.generate(model, ids, drafter=drafter)                             # doctest: +SKIP

    References:
        EAGLE arXiv 2401.15077; EAGLE-2 arXiv 2406.16858; EAGLE-3 arXiv 2503.01840.
    """

    def __init__(self, head, tree=None, *, resync_every: int = 16, cuda_graphs: bool = True):
        if not isinstance(head, (Eagle1Head, Eagle3Head)):
            raise TypeError(f"head must be an Eagle1Head or Eagle3Head, got {type(head).__name__}; load one with "
                            f"specdec.formats.load_eagle_head(path, target)")
        self.head = head
        self.policy = as_policy(tree)
        self.max_num_drafts = self.policy.max_depth
        self.feature_layers = tuple(head.feature_layers)
        self.vocab_size = head.config.vocab_size
        self.resync_every = resync_every
        self.cuda_graphs = cuda_graphs
        self._scratch = self.policy.scratch_slots(self.max_num_drafts)
        self._graphs: dict = {}    # (batch, depth) -> _GraphedDraft, (batch, None) -> _GraphedUpdate
        self._graph_cache = None   # the one cache buffer graphed states reuse (start() hands it out again)

    def __repr__(self) -> str:
        return f"EagleDrafter({type(self.head).__name__}, {self.policy!r})"

    # ---- cache bookkeeping ---------------------------------------------------------------------------

    def _scratch_start(self, cache: HeadCache) -> int:
        return cache.capacity - 1 - self._scratch  # scratch slots, then the trash slot, end the cache

    def _ensure_capacity(self, state: EagleState, width: int) -> EagleState:
        need = state.bound + width + self._scratch + 1  # + 1: the trash slot for invalid entries
        if need <= state.cache.capacity:
            return state
        graphed = state.cache is self._graph_cache
        capacity = _round_up(max(need, 2 * state.cache.capacity), 256 if graphed else 64)
        old = state.cache
        new = self.head.new_cache(old.keys.shape[1], capacity, old.keys.device, old.keys.dtype)
        new.keys[:, :, :, : state.bound] = old.keys[:, :, :, : state.bound]
        new.values[:, :, :, : state.bound] = old.values[:, :, :, : state.bound]
        if graphed:  # graphs captured on the old buffer are stale
            self._graph_cache, self._graphs = new, {}
        return state._replace(cache=new)

    def _absorb(self, state: EagleState, feedback: Feedback) -> EagleState:
        B, M = feedback.tokens.shape
        if M == 0:
            return state
        state = self._ensure_capacity(state, M)
        if (self._graphable(state.lengths.device) and state.cache is self._graph_cache
                and M <= self.max_num_drafts + 1 and state.num_forwards > 0):  # a step's feedback, not a prompt
            lengths, last_hidden = self._graphed(state, None, None).replay(state, feedback)
        else:
            lengths, last_hidden = self._absorb_tensors(state, feedback)
        bound = state.bound + M  # entries continue each row: positions < old length + M
        since = state.since_resync + 1
        if since >= self.resync_every:
            bound = int(lengths.max())  # deliberate host sync, once per resync_every steps
            since = 0
        return EagleState(state.cache, lengths, bound, last_hidden, state.num_forwards + 1, since)

    def _absorb_tensors(self, state: EagleState, feedback: Feedback) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over the feedback entries (no host sync; static shapes given batch, width, capacity).

        Returns:
            ``(lengths [B], last_hidden [B, H])``.
        """
        head = self.head
        tokens, positions, valid = feedback.tokens, feedback.positions, feedback.valid.bool()
        B, M = tokens.shape
        device = tokens.device
        trash = state.cache.capacity - 1
        hidden = head.features_to_hidden(feedback.features)
        slots = torch.where(valid, positions, torch.full_like(positions, trash))
        lengths = torch.maximum(state.lengths, torch.where(valid, positions + 1, 0).amax(1))
        s = torch.arange(state.cache.capacity, device=device)
        sees = (s < lengths[:, None, None]) & (s <= positions[:, :, None])
        sees |= ~valid[:, :, None] & (s == 0)  # padding entries look at slot 0: finite, never used
        out = head(feedback.next_tokens, hidden, positions, sees[:, None], state.cache, slots)
        last = torch.where(valid, torch.arange(M, device=device), -1).amax(1)
        picked = out.gather(1, last.clamp(min=0)[:, None, None].expand(B, 1, out.shape[-1]))[:, 0]
        return lengths, torch.where((last >= 0)[:, None], picked, state.last_hidden.to(picked.dtype))

    # ---- the protocol --------------------------------------------------------------------------------

    @torch.no_grad()
    def start(self, feedback: Feedback) -> EagleState:
        """Run the head over the prompt (target features at every prompt token) and build the state.

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback` (left padding invalid).

        Returns:
            An :class:`EagleState`.
        """
        B, M = feedback.tokens.shape
        device = feedback.tokens.device
        need = M + 2 * (self.max_num_drafts + 1) + self._scratch + 1
        if self._graphable(device):
            # One buffer per drafter, reused by the next start(): graphs stay valid across generate() calls.
            cache = self._graph_cache
            if cache is None or cache.keys.shape[1] != B or cache.capacity < need:
                cache = self._graph_cache = self.head.new_cache(B, _round_up(need + 256, 256), device)
                self._graphs = {}
        else:
            cache = self.head.new_cache(B, _round_up(need), device)
        state = EagleState(cache, torch.zeros(B, dtype=torch.long, device=device), 0,
                           torch.zeros(B, self.head.config.hidden_size, device=device, dtype=self.head.dtype), 0, 0)
        return self._absorb(state, feedback)

    @torch.no_grad()
    def propose(self, state: EagleState, request: ProposeRequest) -> tuple[Draft, EagleState]:
        """Draft a tree per row: level 1 from the root's hidden state, one head forward per further level.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest` (``num_drafts`` bounds the depth).

        Returns:
            ``(draft, state)``.
        """
        if request.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1 (K = 0 is a plain step and never reaches a drafter), got "
                             f"{request.num_drafts}")
        depth = min(self.max_num_drafts, request.num_drafts)
        state = state._replace(num_forwards=state.num_forwards + self.policy.num_forwards(depth))
        if self._graphable(state.lengths.device) and state.cache is self._graph_cache and (
                self.policy.scheme is DraftScheme.DETERMINISTIC or request.sampling.is_greedy):
            return self._graphed(state, request.root_positions, depth).replay(state, request.root_positions), state
        return self._draft(state, request.root_positions, depth, request), state

    def _draft(self, state: EagleState, root_positions: torch.Tensor, depth: int,
               request: ProposeRequest | None = None) -> Draft:
        """The tree of one step (no host sync; static shapes given batch, capacity and depth)."""
        head = self.head
        B = state.lengths.shape[0]
        device = state.lengths.device
        C, S0 = state.cache.capacity, self._scratch_start(state.cache)
        committed = torch.arange(S0, device=device) < state.lengths[:, None]  # [B, S0]

        def expand(tokens: torch.Tensor, parent_hidden: torch.Tensor, visible: torch.Tensor, level: int):
            F, S = tokens.shape[1], visible.shape[-1]
            slots = (S0 + S - F + torch.arange(F, device=device))[None].expand(B, F)
            mask = torch.cat([committed[:, None].expand(B, F, S0), visible,
                              visible.new_zeros(B, F, C - S0 - S)], dim=-1)[:, None]
            positions = (root_positions + (level - 1))[:, None].expand(B, F)
            out = head(tokens, parent_hidden, positions, mask, state.cache, slots)
            return head.logits(out), out

        sampling = request.sampling if request is not None else None
        source = request.source if request is not None else None
        return self.policy.grow(head.logits(state.last_hidden), state.last_hidden, expand, depth=depth,
                                draft_to_target=head.draft_to_target, sampling=sampling, source=source,
                                vocab_size=head.config.vocab_size)

    # ---- CUDA graphs ---------------------------------------------------------------------------------

    def _graphable(self, device) -> bool:
        return self.cuda_graphs and torch.device(device).type == "cuda" and torch.cuda.is_available()

    def _graphed(self, state: EagleState, root_positions: torch.Tensor | None, depth: int | None):
        """The captured draft of ``depth`` levels, or (``depth=None``) the captured update, for this batch."""
        key = (state.lengths.shape[0], depth)
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._graphs[key] = (_GraphedUpdate(self, state) if depth is None
                                           else _GraphedDraft(self, state, root_positions, depth))
        return graphed

    @torch.no_grad()
    def update(self, state: EagleState, feedback: Feedback) -> EagleState:
        """Absorb the committed tokens (root + accepted drafts) and their target features.

        Args:
            state: the state returned by :meth:`propose`.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            The new :class:`EagleState`.
        """
        return self._absorb(state, feedback)


def _capture(fn, device):
    """Warm ``fn`` up on a side stream (lazy tables, kernels' first-call work), then capture it as a CUDA graph.

    Args:
        fn: a function of no arguments whose inputs are fixed tensors.
        device: the CUDA device ``fn`` runs on (captured there, whatever the current device).

    Returns:
        ``(graph, output)``: replaying ``graph`` recomputes ``output`` in place from the same input buffers.
    """
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    return graph, out


class _GraphedDraft:
    """``EagleDrafter._draft`` captured as a CUDA graph for one (batch, depth) on the drafter's cache buffer.

    Inputs (row lengths, root positions, the root's hidden state) are copied into static buffers, the graph
    is replayed, and the draft is cloned out of the graph's output buffers (the next replay overwrites them).
    Warm-up and capture only write tree scratch slots, which no committed entry reads.
    """

    def __init__(self, drafter: EagleDrafter, state: EagleState, root_positions: torch.Tensor, depth: int):
        self.lengths = state.lengths.clone()
        self.root_positions = root_positions.clone()
        self.last_hidden = state.last_hidden.clone()
        static = state._replace(lengths=self.lengths, last_hidden=self.last_hidden)
        self.graph, self.out = _capture(lambda: drafter._draft(static, self.root_positions, depth),
                                        state.lengths.device)

    def replay(self, state: EagleState, root_positions: torch.Tensor) -> Draft:
        self.lengths.copy_(state.lengths)
        self.root_positions.copy_(root_positions)
        self.last_hidden.copy_(state.last_hidden)
        self.graph.replay()
        out = self.out
        return Draft(out.tokens.clone(), out.parents.clone(), out.depths.clone(), None, out.scheme)


class _GraphedUpdate:
    """``EagleDrafter._absorb_tensors`` captured as a CUDA graph for one batch size, on feedback padded to the
    widest a step can send (``max_num_drafts + 1`` entries; the padding is invalid and goes to the trash slot).

    Capture runs the head on all-invalid feedback, so it writes only the trash slot.
    """

    def __init__(self, drafter: EagleDrafter, state: EagleState):
        B, W = state.lengths.shape[0], drafter.max_num_drafts + 1
        device = state.lengths.device
        head = drafter.head

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        size = head.config.feature_size
        self.feedback = Feedback(zeros(B, W), zeros(B, W), zeros(B, W), zeros(B, W, dtype=torch.bool),
                                 tuple(zeros(B, W, size, dtype=head.dtype) for _ in head.feature_layers),
                                 zeros(B))
        self.lengths = state.lengths.clone()
        self.last_hidden = state.last_hidden.clone()
        static = state._replace(lengths=self.lengths, last_hidden=self.last_hidden)
        self.graph, self.out = _capture(lambda: drafter._absorb_tensors(static, self.feedback), device)

    def replay(self, state: EagleState, feedback: Feedback) -> tuple[torch.Tensor, torch.Tensor]:
        M = feedback.tokens.shape[1]
        fb = self.feedback
        fb.valid.zero_()
        for buf, new in [(fb.tokens, feedback.tokens), (fb.next_tokens, feedback.next_tokens),
                         (fb.positions, feedback.positions), (fb.valid, feedback.valid),
                         *zip(fb.features, feedback.features)]:
            buf[:, :M].copy_(new)
        self.lengths.copy_(state.lengths)
        self.last_hidden.copy_(state.last_hidden)
        self.graph.replay()
        lengths, last_hidden = self.out
        return lengths.clone(), last_hidden.clone()
