"""An independent draft model (speculative sampling, SpS) as a drafter: any HF causal LM with the target's
vocabulary, drafting a chain or a static tree, by top-k or by sampling.

References:
    Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", arXiv 2211.17192.
    Chen et al., "Accelerating LLM Decoding with Speculative Sampling", arXiv 2302.01318.
    Miao et al., "SpecInfer", arXiv 2305.09781 (trees of draft tokens).
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch

from ..adapter import CacheState, ModelAdapter
from ..sampling import process_logits
from ..trees import Tree, chain_tree, compile_tree
from ..types import Draft, DraftScheme
from .base import Feedback, ProposeRequest

__all__ = ["DraftModelDrafter", "DraftModelState", "left_compact"]

_MODES = ("auto", "topk", "sample", "sample_iid")
#: Padded forward sizes of the draft model on the fast path (chain levels: 1; pending tokens and tree levels: more).
_DRAFT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def left_compact(values: torch.Tensor, keep: torch.Tensor, fill: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's kept entries to the front, in order.

    Args:
        values: Shape ``[B, W]``.
        keep: Shape ``[B, W]`` bool.
        fill: value written after the kept entries.

    Returns:
        ``(compacted [B, W], counts [B])``.
    """
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    out = values.gather(1, order)
    counts = keep.sum(1)
    ar = torch.arange(values.shape[1], device=values.device)[None, :]
    return out.masked_fill(ar >= counts[:, None], fill), counts


def _to_vocab(logits: torch.Tensor, vocab: int | None) -> torch.Tensor:
    """The draft's logits over the target's ``V`` ids: rows past ``V`` (a padded embedding) dropped, missing ids
    scored ``-inf`` (never proposed, probability 0)."""
    if vocab is None or logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=-math.inf)


class DraftModelState(NamedTuple):
    """State of :class:`DraftModelDrafter`.

    A state is consumed by the ``propose`` / ``update`` it is passed to (the draft model's KV cache is updated in
    place); a call that touches the cache of a reused state raises :class:`~specdec.adapter.ConsumedStateError`.

    Attributes:
        cache: the draft model's cache (a :class:`~specdec.adapter.CacheState`, or a
            :class:`~specdec.static.StaticCacheState` with ``fast=True``).
        pending_tokens: Shape ``[B, P0]``, committed tokens the draft model has not run yet, left-aligned
            (the last real one is the root).
        pending_counts: Shape ``[B]``, real entries of ``pending_tokens``.
        node_slots: Shape ``[B, N + 1]``, pending-cache slot of each node of the last proposal (-1: not run).
        num_forwards: draft-model forwards so far.
    """

    cache: CacheState  # or StaticCacheState (fast=True)
    pending_tokens: torch.Tensor
    pending_counts: torch.Tensor
    node_slots: torch.Tensor | None
    num_forwards: int


class DraftModelDrafter:
    """Draft with an independent HF causal LM, one draft forward per tree level.

    Args:
        model: the draft model (same tokenizer as the target; ``sdpa`` or ``eager`` attention). Its embedding may
            be padded past the target's vocabulary: those rows are masked out of its logits, so it never
            proposes an id the target does not have.
        num_drafts: the largest K (chain length, or depth bound of ``tree``); default: the tree's depth, or 4
            for a chain. A K deeper than ``tree`` is refused (specdec refuses rather than clamps).
        tree: tree choices or a compiled :class:`~specdec.trees.Tree`; ``None`` drafts a chain of K tokens.
        mode: ``"topk"`` (deterministic: each node's children are its top-ranked tokens; verified target-only),
            ``"sample"`` (children sampled without replacement — a chain is then plain sampling; verified by
            recursive rejection sampling), ``"sample_iid"`` (children sampled i.i.d.; SpecInfer verification),
            or ``"auto"``: ``"topk"`` when greedy, ``"sample"`` otherwise.
        fast: run the draft model on the fast path (:class:`~specdec.static.StaticAdapter`): a preallocated KV
            cache and, on CUDA, one captured CUDA graph per padded forward size. Each level of a chain is a
            one-token forward (a bucket-1 replay); the pending committed tokens are one bucketed forward; the
            commit moves each row's kept entries in place to the row's own end, without a host sync
            (``StaticAdapter.commit(late=True)``). Same drafts as ``fast=False`` (float32). A draft model the
            static path refuses (see :func:`~specdec.static.static_support`) runs eagerly after one warning.
            ``fast="compile"``: the same, each captured forward compiled by ``torch.compile`` first (on CUDA).
        capture_chain: with ``fast``, a greedy chain (no ``tree``, ``topk`` mode) drafts its K tokens in one
            captured step (:meth:`~specdec.static.StaticAdapter.forward_chain`: the pending tokens' forward and
            K - 1 one-token forwards with their argmaxes) instead of one replay per level with host work between.
            Same drafts. On by default (H200, session 11: SpS on the fixture 870 -> 1316 tok/s at K = 4,
            885 -> 1702 at K = 6); ``False`` drafts level by level.
        capacity: with ``fast=True``, cache slots per row (``Lmax``; attention spans all of them every forward):
            at least prompt + new tokens + the widest forward + 1, e.g.
            ``capacity_for(prompt_len, max_new_tokens, 16)``. ``None``: the draft model's
            ``max_position_embeddings`` plus 64, rounded up to 64 (never too small, but
            every forward then attends over that many slots).

    Each draft carries its :class:`~specdec.types.DraftScheme`, so ``generate()`` pairs it with the verifier
    that is exact for it.
    """

    def __init__(self, model, num_drafts: int | None = None, tree: Tree | list | str | None = None,
                 mode: str = "auto", *, fast: bool | str = False, capacity: int | None = None,
                 capture_chain: bool = True):
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
        if tree is not None and not isinstance(tree, Tree):
            tree = compile_tree(tree)
        if num_drafts is None:
            num_drafts = tree.max_depth if tree is not None else 4
        if num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1, got {num_drafts}.")
        if tree is not None and num_drafts > tree.max_depth:
            raise ValueError(
                f"num_drafts={num_drafts} is deeper than the tree, which has {tree.max_depth} levels: pass "
                f"num_drafts <= {tree.max_depth} (or leave it out to use the tree's depth), or a deeper tree. specdec "
                f"refuses rather than clamps, so that the K you asked for is the K you get.")
        from ..static import fast_mode

        fast_mode(fast)  # a named error for anything but False, True, "graphs" or "compile"
        self.model = model
        self.adapter = ModelAdapter(model, role="draft model")
        self.fast = fast
        self.capture_chain = bool(capture_chain)
        self.capacity = capacity
        self._static = None  # the StaticAdapter (fast=True), built at the first start() and kept with its graphs
        self.tree = tree
        self.mode = mode
        self.max_num_drafts = num_drafts
        self.feature_layers: tuple[int, ...] = ()
        self.vocab_size = getattr(model.config, "vocab_size", None)
        self._trees: dict = {}

    def _plan(self, k: int, device) -> tuple[Tree, list]:
        """Per level: (nodes, parent position among the previous run, ranks, max children,
        (nodes to run, their parents) or None), all on ``device``: built once per K, no copies per step."""
        key = (k, str(device))
        if key not in self._trees:
            tree = chain_tree(k) if self.tree is None else self.tree.prune(k)
            parents, depths, ranks = tree.parents, tree.depths, tree.ranks
            has_child = torch.zeros(tree.num_nodes + 1, dtype=torch.bool)
            has_child[parents[1:]] = True
            plan, prev_run = [], torch.zeros(1, dtype=torch.long)
            for level in range(1, tree.max_depth + 1):
                lvl = torch.nonzero(depths == level).flatten()
                parent_pos = torch.searchsorted(prev_run, parents[lvl])
                run = lvl[has_child[lvl]] if level < tree.max_depth else None
                has_run = run is not None and run.numel() > 0
                plan.append((lvl.to(device), parent_pos.to(device), ranks[lvl].to(device), int(ranks[lvl].max()) + 1,
                             (run.to(device), parents[run].to(device)) if has_run else None))
                if run is None or run.numel() == 0:
                    break
                prev_run = run
            self._trees[key] = (tree.to(device), plan)
        return self._trees[key]

    # ------------------------------------------------------------------ protocol
    def _fast_adapter(self, prompt_len: int):
        """The draft model's :class:`~specdec.static.StaticAdapter`, checked to hold ``prompt_len`` (``None``: eager).

        Built once and kept: its buffers and captured graphs are reused by later runs of the same batch size. A run
        that outgrows ``capacity`` raises :class:`~specdec.static.CapacityError` (the cache never wraps around).
        """
        from ..static import StaticAdapter, capacity_for, compiled_capture, static_support

        if self._static is False:
            return None
        if self._static is None:
            reason = static_support(self.model)
            if reason is not None:
                warnings.warn(f"DraftModelDrafter(fast=True): the draft model {type(self.model).__name__} runs "
                              f"eagerly: {reason}.", stacklevel=3)
                self._static = False
                return None
        capacity = self.capacity
        if capacity is None:
            capacity = capacity_for(self.adapter.max_positions or 2048, 0, max(_DRAFT_BUCKETS))
        if prompt_len + self.max_num_drafts + 2 > capacity:  # the prompt, then one step of pending tokens
            raise ValueError(f"DraftModelDrafter(fast=True, capacity={capacity}) cannot hold a prompt of "
                             f"{prompt_len} tokens and a draft of {self.max_num_drafts}: pass "
                             f"capacity=capacity_for(prompt_len, max_new_tokens, 16) or larger.")
        if self._static is None or self._static.capacity != capacity:
            compiled = self.fast == "compile" and next(self.model.parameters()).is_cuda
            self._static = StaticAdapter(self.model, capacity=capacity, buckets=_DRAFT_BUCKETS, role="draft model",
                                         capture=compiled_capture() if compiled else None)
        return self._static

    def start(self, feedback: Feedback) -> DraftModelState:
        """Run the prompt through the draft model; the first root becomes pending.

        Args:
            feedback: the prompt's :class:`Feedback` (``tokens`` and ``valid``, shape ``[B, T]``).

        Returns:
            The initial :class:`DraftModelState`.
        """
        if self.fast:
            self.adapter = self._fast_adapter(feedback.tokens.shape[1]) or self.adapter
        _, cache = self.adapter.prefill(feedback.tokens, feedback.valid)
        return DraftModelState(cache=cache, pending_tokens=feedback.roots[:, None],
                               pending_counts=torch.ones_like(feedback.roots), node_slots=None, num_forwards=1)

    def propose(self, state: DraftModelState, request: ProposeRequest) -> tuple[Draft, DraftModelState]:
        """Draft a tree (or chain) of depth ``request.num_drafts`` level by level."""
        if request.num_drafts > self.max_num_drafts:
            raise ValueError(f"K={request.num_drafts} exceeds this drafter's maximum of {self.max_num_drafts}.")
        tree, plan = self._plan(request.num_drafts, request.roots.device)
        mode = self.mode
        if mode == "auto" or request.sampling.is_greedy:
            mode = "topk" if request.sampling.is_greedy else "sample"
        if mode == "topk" and self.tree is None and self.capture_chain and hasattr(self.adapter, "forward_chain"):
            return self._propose_chain(state, request, tree)
        source = None if mode == "topk" else request.source
        device = request.roots.device
        B = request.roots.shape[0]
        N = tree.num_nodes
        cache = state.cache
        node_slots = torch.full((B, N + 1), -1, dtype=torch.long, device=device)
        tokens = torch.zeros(B, N + 1, dtype=torch.long, device=device)
        tokens[:, 0] = request.roots
        keep_q = mode != "topk"
        qs_per_level = []

        # Level 0: run the pending committed tokens (a chain ending in the root).
        P0 = state.pending_tokens.shape[1]
        chain_parents, positions, present = self._pending_chain(state)
        out, cache = self.adapter.forward(cache, state.pending_tokens, chain_parents, positions, present)
        forwards = 1
        root_slot = state.pending_counts - 1
        node_slots[:, 0] = root_slot
        vocab = request.vocab_size
        logits = _to_vocab(out.logits.gather(1, root_slot[:, None, None].expand(-1, 1, out.logits.shape[-1])), vocab)
        root_pos = cache.lengths + root_slot
        num_slots = P0
        for level, (lvl, parent_pos, lvl_ranks, n_child, to_run) in enumerate(plan, start=1):
            # Children of this level's parents, chosen from the parents' draft distributions.
            q = process_logits(logits.float(), request.sampling) if keep_q else None
            choice = self._choose(logits.float(), q, n_child, mode, source)  # [B, n_parents, n_child]
            tokens[:, lvl] = choice[:, parent_pos, lvl_ranks]
            if keep_q:
                qs_per_level.append(q[:, parent_pos])
            if to_run is None:
                break
            run, run_parents = to_run
            # Run the nodes of this level that have children; their logits feed the next level.
            out, cache = self.adapter.forward(cache, tokens[:, run], node_slots[:, run_parents],
                                              (root_pos[:, None] + level).expand(B, run.numel()))
            forwards += 1
            node_slots[:, run] = num_slots + torch.arange(run.numel(), device=device)[None, :]
            num_slots += run.numel()
            logits = _to_vocab(out.logits, vocab)
        draft_q = torch.cat(qs_per_level, 1) if keep_q else None
        parents, depths = tree.parents, tree.depths  # already on the device (see _plan)

        draft = Draft(
            tokens=tokens[:, 1:],
            parents=parents[None].expand(B, -1).contiguous(),
            depths=depths[None].expand(B, -1).contiguous(),
            draft_probs=draft_q,
            scheme={"topk": DraftScheme.DETERMINISTIC, "sample": DraftScheme.WITHOUT_REPLACEMENT,
                    "sample_iid": DraftScheme.IID}[mode],
        )
        if keep_q and tree.num_nodes == tree.max_depth:
            draft = draft._replace(scheme=DraftScheme.IID)  # a sampled chain: one child per node
        return draft, state._replace(cache=cache, node_slots=node_slots, num_forwards=state.num_forwards + forwards)

    @staticmethod
    def _pending_chain(state: DraftModelState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pending committed tokens as a chain: ``(parents, positions, present)``, each ``[B, P0]``."""
        B, P0 = state.pending_tokens.shape
        ar = torch.arange(P0, device=state.pending_tokens.device)[None, :]
        present = ar < state.pending_counts[:, None]
        return (ar - 1).expand(B, P0).masked_fill(~present, -1), state.cache.lengths[:, None] + ar, present

    def _propose_chain(self, state: DraftModelState, request: ProposeRequest, tree: Tree
                       ) -> tuple[Draft, DraftModelState]:
        """A greedy chain on the fast path: the pending tokens and K - 1 levels as one captured step."""
        k = request.num_drafts
        B, P0 = state.pending_tokens.shape
        device = request.roots.device
        chain_parents, positions, present = self._pending_chain(state)
        root_slot = state.pending_counts - 1
        drafts, cache = self.adapter.forward_chain(state.cache, state.pending_tokens, chain_parents, positions,
                                                   present, root_slot, k, request.vocab_size)
        node_slots = torch.cat([root_slot[:, None], (P0 + torch.arange(k - 1, device=device)).expand(B, -1),
                                torch.full((B, 1), -1, dtype=torch.long, device=device)], 1)
        draft = Draft(tokens=drafts, parents=tree.parents[None].expand(B, -1).contiguous(),
                      depths=tree.depths[None].expand(B, -1).contiguous(), draft_probs=None,
                      scheme=DraftScheme.DETERMINISTIC)
        return draft, state._replace(cache=cache, node_slots=node_slots, num_forwards=state.num_forwards + k)

    @staticmethod
    def _choose(logits, q, n_child, mode, source) -> torch.Tensor:
        """Children tokens per parent: ``[B, n_parents, n_child]``."""
        if mode == "topk":
            return logits.topk(n_child, dim=-1).indices
        picks = []
        weights = q.clone()
        for _ in range(n_child):
            tok = source.categorical(weights)
            picks.append(tok)
            if mode == "sample":  # without replacement: remove the drawn token for the next sibling
                weights = weights.scatter(-1, tok[..., None], 0.0)
        return torch.stack(picks, -1)

    def update(self, state: DraftModelState, feedback: Feedback) -> DraftModelState:
        """Keep the draft cache of committed tokens; what the draft model has not run becomes pending."""
        B, M = feedback.tokens.shape
        device = feedback.tokens.device
        P0 = state.pending_tokens.shape[1]
        if state.node_slots is None:  # a plain step (K = 0): the draft ran nothing, the new root queues up
            pend = torch.cat([state.pending_tokens, feedback.roots[:, None]], 1)
            pend = pend.scatter(1, state.pending_counts[:, None], feedback.roots[:, None])
            return state._replace(pending_tokens=pend, pending_counts=state.pending_counts + 1)
        path = feedback.accepted_nodes.clamp(min=0)
        slots = state.node_slots.gather(1, path)  # slot of each committed path entry
        slots = slots.masked_fill(~feedback.valid, -1)
        ran = slots >= 0
        ran[:, 0] = False  # the root is among the pending committed tokens already
        ar = torch.arange(P0, device=device)[None, :].expand(B, -1)
        committed_pending = ar < state.pending_counts[:, None]
        keep, counts = left_compact(torch.cat([ar, slots], 1), torch.cat([committed_pending, ran], 1))
        # Committed path tokens the draft model did not run (at most the deepest), then the new root.
        not_run = feedback.valid & (slots < 0)
        not_run[:, 0] = False
        pend, pcount = left_compact(torch.cat([feedback.tokens, feedback.roots[:, None]], 1),
                                    torch.cat([not_run, torch.ones(B, 1, dtype=torch.bool, device=device)], 1), 0)
        if getattr(self.adapter, "commits_late", False):
            # The fast path's draft cache: each row's kept slots move to the row's own end, no widths on the host
            # (a kept path holds at most every pending slot; the pending tokens keep their full width, the absent
            # ones masked by pending_counts).
            width = min(keep.shape[1], state.cache.num_pending)
            cache = self.adapter.commit(state.cache, keep[:, :width], counts, late=True)
            return state._replace(cache=cache, pending_tokens=pend, pending_counts=pcount, node_slots=None)
        # The kept path is a prefix of the pending slots (nothing moves) when keep[b, j] == j for j < counts[b];
        # it leaves no hole when every row keeps the widest count.
        in_order = (keep == torch.arange(keep.shape[1], device=device)[None, :]) | (keep < 0)
        # One host sync for both widths and the commit's two flags (so commit() need not sync again).
        width, pwidth, prefix, full = torch.stack([counts.max(), pcount.max(), in_order.all().long(),
                                                   (counts == counts.max()).all().long()]).tolist()
        cache = self.adapter.commit(state.cache, keep[:, :width], counts, prefix=bool(prefix), full=bool(full))
        return state._replace(cache=cache, pending_tokens=pend[:, :pwidth], pending_counts=pcount, node_slots=None)
