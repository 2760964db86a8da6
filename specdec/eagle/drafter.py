"""The EAGLE drafter: one class for every EAGLE recipe (a head + a tree policy).

:class:`EagleDrafter` implements the :class:`~specdec.drafters.Drafter` protocol around an
:class:`~specdec.eagle.Eagle1Head` or :class:`~specdec.eagle.Eagle3Head`. Tree policies:

- :class:`StaticTree`: a fixed tree of sibling ranks (EAGLE-1's ``mc_sim_7b_63``); node ``i`` gets the
  ``rank(i)``-th most likely child of its parent. ``DETERMINISTIC``.
- :class:`~specdec.eagle.DynamicTree`: EAGLE-2's per-step tree (expand top-k, rerank). ``DETERMINISTIC``.
- :class:`SampledTree`: EAGLE-1's sampled static tree: each node's children are drawn *without replacement*
  from the head's processed distribution. ``WITHOUT_REPLACEMENT`` (with ``draft_probs``).

Recipes: :func:`eagle1` (EAGLE-1 head + static tree), :func:`eagle2` (EAGLE-1 head + dynamic tree),
:func:`eagle3` (EAGLE-3 head + dynamic tree).

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

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ..drafters.base import Feedback, ProposeRequest
from ..types import Draft, DraftScheme, SamplingParams
from .dynamic_tree import DynamicTree, ExpandFn
from .heads import Eagle1Head, Eagle3Head, HeadCache

__all__ = ["EagleDrafter", "EagleState", "StaticTree", "SampledTree", "eagle1", "eagle2", "eagle3"]


# --------------------------------------------------------------------------------------------------------
# Static trees
# --------------------------------------------------------------------------------------------------------


def _compile(tree):
    from .. import trees

    if hasattr(tree, "parents") and hasattr(tree, "prune"):
        return tree
    return trees.compile_tree(tree)


class _StaticPlan(NamedTuple):
    parents: torch.Tensor            # [N + 1]
    depths: torch.Tensor             # [N + 1]
    level_nodes: list                # per level d = 1..D: node indices [n_d]
    level_width: list                # per level: top-k width (max rank + 1)
    level_parent_pos: list           # per level d >= 2: position of each node's parent in expanded[d - 1]
    level_ranks: list                # per level: rank of each node
    expanded: list                   # per level d = 1..D-1: expanded node indices [F_d]
    expanded_parent_pos: list        # per level d >= 2: position of each expanded node's parent in expanded[d-1]
    visible: list                    # per level d = 1..D-1: [F_d, S_d] bool over scratch slots
    num_expanded: int


def _build_plan(tree, device) -> _StaticPlan:
    parents = tree.parents.tolist()
    depths = tree.depths.tolist()
    ranks = tree.ranks.tolist()
    children = tree.num_children.tolist()
    anc = tree.ancestor_mask.cpu()
    D = tree.max_depth
    levels = [[i for i in range(1, len(parents)) if depths[i] == d] for d in range(1, D + 1)]
    expanded = [[i for i in nodes if children[i] > 0] for nodes in levels[:-1]]
    slot_order = [i for level in expanded for i in level]
    visible, seen = [], 0
    for level in expanded:
        seen += len(level)
        cols = torch.tensor(slot_order[:seen], dtype=torch.long)
        rows = torch.tensor(level, dtype=torch.long)
        visible.append(anc[rows][:, cols].to(device))

    def t(values):
        return torch.tensor(values, dtype=torch.long, device=device)

    def pos_in(prev, nodes):
        index = {n: j for j, n in enumerate(prev)}
        return t([index[parents[n]] for n in nodes])

    return _StaticPlan(
        parents=t(parents),
        depths=t(depths),
        level_nodes=[t(nodes) for nodes in levels],
        level_width=[max(ranks[i] for i in nodes) + 1 for nodes in levels],
        level_parent_pos=[None] + [pos_in(expanded[d - 1], levels[d]) for d in range(1, D)],
        level_ranks=[t([ranks[i] for i in nodes]) for nodes in levels],
        expanded=[t(level) for level in expanded],
        expanded_parent_pos=[None] + [pos_in(expanded[d - 1], expanded[d]) for d in range(1, D - 1)],
        visible=visible,
        num_expanded=len(slot_order),
    )


class StaticTree:
    """EAGLE-1's static tree policy: node ``i`` is its parent's ``rank(i)``-th most likely child.

    Args:
        tree: a compiled :class:`specdec.trees.Tree` or tree choices (e.g.
            ``specdec.trees.EAGLE_MC_SIM_7B_63``). A step's ``K`` prunes it to depth ``K``.

    References:
        EAGLE arXiv 2401.15077 (``mc_sim_7b_63``, ``generate_tree_buffers``).
    """

    scheme = DraftScheme.DETERMINISTIC

    def __init__(self, tree):
        self.tree = _compile(tree)
        if self.tree.max_depth < 1:
            raise ValueError("the static tree has no draft node: give at least one path, e.g. [(0,)]")
        self._plans: dict = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tree!r})"

    @property
    def max_depth(self) -> int:
        """Deepest level of the tree."""
        return self.tree.max_depth

    def plan(self, depth: int, device) -> _StaticPlan:
        """The tree pruned to ``depth`` levels, laid out per level (built once per depth and device).

        Args:
            depth: levels to keep (``Tree.prune``).
            device: where the index tensors live.

        Returns:
            The cached per-level layout (node indices, top-k widths, expanded nodes, scratch visibility).
        """
        key = (depth, str(device))
        if key not in self._plans:
            self._plans[key] = _build_plan(self.tree.prune(depth), torch.device(device))
        return self._plans[key]

    def scratch_slots(self, depth: int) -> int:
        """Head KV slots written per step (nodes with children above the last level).

        Args:
            depth: levels drafted.

        Returns:
            The number of scratch slots.
        """
        return self.plan(depth, "cpu").num_expanded

    def num_forwards(self, depth: int) -> int:
        """Head forwards per step beyond the root's.

        Args:
            depth: levels drafted.

        Returns:
            One per level that has children.
        """
        return len(self.plan(depth, "cpu").expanded)

    def _children(self, logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size):
        # logits [B, F, V']; returns target tokens [B, n], plus (draft_probs [B, n, V], present [B, n]) or None
        ids = logits.float().topk(width, dim=-1).indices
        return to_target(ids[:, parent_pos, ranks]), None

    def grow(self, root_logits: torch.Tensor, root_hidden: torch.Tensor, expand: ExpandFn, *, depth: int,
             draft_to_target=None, sampling: SamplingParams | None = None, generator=None,
             vocab_size: int | None = None) -> Draft:
        """Draft the tree pruned to ``depth`` levels, one ``expand`` call per level above the last.

        Args:
            root_logits: the head's logits after the root. Shape: ``[B, V']``.
            root_hidden: the head's output at the root. Shape: ``[B, H]``.
            expand: the head's frontier forward (see :mod:`specdec.eagle.dynamic_tree`).
            depth: levels to draft (``<= max_depth``).
            draft_to_target: draft-to-target id map (identity if ``None``).
            sampling, generator, vocab_size: used by :class:`SampledTree` only.

        Returns:
            A :class:`~specdec.types.Draft` (every row the same tree shape).
        """
        to_target = draft_to_target or (lambda x: x)
        plan = self.plan(depth, root_logits.device)
        B, H = root_hidden.shape
        source = None
        if self.scheme is not DraftScheme.DETERMINISTIC and sampling is not None and not sampling.is_greedy:
            from ..sampling import as_source

            source = as_source(generator)
        N = plan.parents.shape[0] - 1
        tokens = root_logits.new_zeros((B, N + 1), dtype=torch.long)
        probs = present = None
        if source is not None:
            probs = root_logits.new_zeros((B, N + 1, vocab_size), dtype=torch.float32)
            present = torch.ones(B, N + 1, dtype=torch.bool, device=root_logits.device)

        def place(level, logits, parent_pos):
            nodes = plan.level_nodes[level]
            got, extra = self._children(logits, plan.level_width[level], parent_pos, plan.level_ranks[level],
                                        to_target, sampling, source, vocab_size)
            tokens[:, nodes] = got
            if extra is not None:
                probs[:, nodes], present[:, nodes] = extra

        zero = torch.zeros(len(plan.level_nodes[0]), dtype=torch.long, device=root_logits.device)
        place(0, root_logits[:, None], zero)
        hidden_prev = root_hidden[:, None]
        for d in range(1, depth):
            nodes = plan.expanded[d - 1]
            F = nodes.shape[0]
            if d == 1:
                parent_hidden = hidden_prev.expand(B, F, H)
            else:
                parent_hidden = hidden_prev.index_select(1, plan.expanded_parent_pos[d - 1])
            visible = plan.visible[d - 1][None].expand(B, -1, -1)
            logits, hidden_prev = expand(tokens[:, nodes], parent_hidden, visible, d)
            place(d, logits, plan.level_parent_pos[d])
        parents = plan.parents[None].expand(B, -1).clone()
        depths = plan.depths[None].expand(B, -1).clone()
        if source is None:
            return Draft(tokens[:, 1:], parents, depths, None, DraftScheme.DETERMINISTIC)
        for d in range(1, depth):  # a node is present only if its whole path is
            nodes = plan.level_nodes[d]
            present[:, nodes] &= present[:, plan.parents[nodes]]
        parents = parents.masked_fill(~present, -1)
        depths = depths.masked_fill(~present, 0)
        return Draft(tokens[:, 1:], parents, depths, probs[:, 1:], DraftScheme.WITHOUT_REPLACEMENT)


class SampledTree(StaticTree):
    """EAGLE-1's sampled static tree: each node's children are drawn without replacement from the head.

    Child ``r`` of a node is sampled from the head's processed distribution (temperature / top-k / top-p, the
    run's :class:`~specdec.types.SamplingParams`) with its ``r`` earlier siblings removed and the rest
    renormalised. ``draft_probs`` of a node is its parent's full processed distribution (over the target
    vocabulary). A child that cannot be drawn (the distribution has fewer tokens than the tree wants) is
    absent (``parents == -1``), with its subtree. At temperature 0 it drafts the top-k tree
    (``DETERMINISTIC``), like :class:`StaticTree`.

    Args:
        tree: a compiled tree or tree choices.

    References:
        EAGLE arXiv 2401.15077 (v1 code: ``multinomial(..., replacement=False)``); Jeon et al., "Recursive
        Speculative Decoding", arXiv 2402.14160 (lossless verification of drafts sampled without replacement).
    """

    scheme = DraftScheme.WITHOUT_REPLACEMENT

    def _children(self, logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size):
        if source is None:
            return super()._children(logits, width, parent_pos, ranks, to_target, sampling, source, vocab_size)
        from ..sampling import process_logits

        B, F, Vd = logits.shape
        draft_probs = process_logits(logits.float(), sampling)          # [B, F, V']
        weights = draft_probs.clone()
        picks, ok = [], []
        for _ in range(width):
            idx = source.categorical(weights)                            # [B, F]
            ok.append(weights.gather(-1, idx[..., None])[..., 0] > 0)
            weights.scatter_(-1, idx[..., None], 0.0)
            picks.append(idx)
        picks = torch.stack(picks, -1)[:, parent_pos, ranks]             # [B, n]
        ok = torch.stack(ok, -1)[:, parent_pos, ranks]
        targets = to_target(torch.arange(Vd, device=logits.device))
        full = draft_probs.new_zeros(B, F, vocab_size)
        full[..., targets] = draft_probs
        return to_target(picks), (full[:, parent_pos], ok)


def _as_policy(tree):
    if isinstance(tree, (DynamicTree, StaticTree)):
        return tree
    if tree is None:
        return DynamicTree()
    if hasattr(tree, "parents") or isinstance(tree, (Sequence, str)):
        return StaticTree(tree)
    raise TypeError(f"tree must be a DynamicTree, StaticTree, SampledTree, a compiled Tree or tree choices, got "
                    f"{type(tree).__name__}")


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
        head: an :class:`~specdec.eagle.Eagle1Head` or :class:`~specdec.eagle.Eagle3Head` (on the target's
            device).
        tree: the tree policy: :class:`~specdec.eagle.DynamicTree` (default ``DynamicTree()``: EAGLE-2),
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
                            f"specdec.eagle.load_eagle_head(path, target)")
        self.head = head
        self.policy = _as_policy(tree)
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
        generator = request.generator if request is not None else None
        return self.policy.grow(head.logits(state.last_hidden), state.last_hidden, expand, depth=depth,
                                draft_to_target=head.draft_to_target, sampling=sampling, generator=generator,
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


# --------------------------------------------------------------------------------------------------------
# Recipes
# --------------------------------------------------------------------------------------------------------


def eagle1(head: Eagle1Head, tree=None) -> EagleDrafter:
    """EAGLE-1: an EAGLE-1 head with a static top-k tree (default ``EAGLE_MC_SIM_7B_63``).

    Args:
        head: an :class:`~specdec.eagle.Eagle1Head`.
        tree: tree choices or a compiled tree (default: the authors' 26-node ``mc_sim_7b_63``).

    Returns:
        An :class:`EagleDrafter`.

    References:
        EAGLE arXiv 2401.15077.
    """
    from ..trees import EAGLE_MC_SIM_7B_63

    return EagleDrafter(head, StaticTree(EAGLE_MC_SIM_7B_63 if tree is None else tree))


def eagle2(head, *, total_tokens: int = 60, depth: int = 6, top_k: int = 10) -> EagleDrafter:
    """EAGLE-2: an EAGLE head with the dynamic tree (expand top-k by cumulative log-prob, rerank).

    Args:
        head: an :class:`~specdec.eagle.Eagle1Head` (or an EAGLE-3 head).
        total_tokens, depth, top_k: see :class:`~specdec.eagle.DynamicTree`.

    Returns:
        An :class:`EagleDrafter`.

    References:
        EAGLE-2 arXiv 2406.16858.
    """
    return EagleDrafter(head, DynamicTree(total_tokens, depth, top_k))


def eagle3(head: Eagle3Head, *, total_tokens: int = 60, depth: int = 8, top_k: int = 10) -> EagleDrafter:
    """EAGLE-3: an EAGLE-3 head with the dynamic tree (deeper by default: the authors advise depth 7-8 in
    their convention, i.e. 8-9 levels here).

    Args:
        head: an :class:`~specdec.eagle.Eagle3Head`.
        total_tokens, depth, top_k: see :class:`~specdec.eagle.DynamicTree`.

    Returns:
        An :class:`EagleDrafter`.

    References:
        EAGLE-3 arXiv 2503.01840; SafeAILab/EAGLE issue #209 (depth advice).
    """
    if not isinstance(head, Eagle3Head):
        raise TypeError(f"eagle3() needs an Eagle3Head, got {type(head).__name__}; use eagle2() for an EAGLE-1 head")
    return EagleDrafter(head, DynamicTree(total_tokens, depth, top_k))
