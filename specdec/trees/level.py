"""Level-wise static trees: every node of level ``d`` takes a rank of level ``d``'s own distribution.

This is Medusa's tree semantics. A parallel head gives one distribution per level from a single forward (head
``d - 1`` predicts the token ``d`` positions after the root), independent of the tokens above it; a node with
path ``(r_1, ..., r_d)`` (tree choices, :mod:`specdec.trees.core`) is the ``r_d``-th most likely token of level
``d``, whatever its parent's token is. Compare :class:`specdec.trees.StaticTree` (EAGLE-1), where a node is the
``r``-th most likely child *of its parent*, drafted autoregressively.

- :class:`LevelTree`: the policy (a compiled tree plus cached index plans); :meth:`LevelTree.chain` is the
  1-wide case, the chain of every level's top-1 (vLLM's Medusa proposer).
- :func:`level_tree_draft` (vectorised: one ``topk`` and one gather) and :func:`level_tree_draft_ref` (a per-row,
  per-node loop over ``argsort``), same signature.
- With a *transition* (DSpark's low-rank Markov head, arXiv 2607.05147), a node's children depend on its own
  token: the children of a node holding token ``x`` at level ``d - 1`` are the top ranks of
  ``z_d + transition(x, d)``. Drafting then goes level by level (one batched ``transition`` call and one ``topk``
  per level over that level's parent nodes; a chain is a sequential argmax), still deterministic.

Top-k is a deterministic function of the head's logits, so the drafts are ``DraftScheme.DETERMINISTIC`` and the
target-only tree verifier is exact for them at any temperature.

References:
    Cai et al., "Medusa", arXiv 2401.10774 (Sec. 2.1.2, tree attention; ``medusa_choices``,
    ``generate_candidates``: candidates gathered from every head's top-k by ``tree_indices``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ..types import Draft, DraftScheme
from .core import Tree, chain_tree, compile_tree

__all__ = ["LevelTree", "Transition", "as_level_policy", "level_tree_draft", "level_tree_draft_ref"]

#: ``transition(prev_tokens, level) -> bias``: the logit bias of level ``level`` (1-based) for a node whose parent
#: holds ``prev_tokens``. Shape: ``prev_tokens [B, n]`` int64 -> ``bias [B, n, V]`` (DSpark's Markov head).
Transition = Callable[[torch.Tensor, int], torch.Tensor]


class _LevelPlan(NamedTuple):
    parents: torch.Tensor     # [N + 1]
    depths: torch.Tensor      # [N + 1]
    flat_index: torch.Tensor  # [N]: (level - 1) * width + rank of each draft node
    width: int                # top-k needed: largest rank + 1
    depth: int                # levels drafted


def _plan(tree: Tree, device) -> _LevelPlan:
    depths = tree.depths[1:]
    ranks = tree.ranks[1:]
    width = 1 + max((path[-1] for path in tree.choices), default=0)  # from host data: no graph break in a compile
    return _LevelPlan(tree.parents.to(device), tree.depths.to(device),
                      ((depths - 1) * width + ranks).to(device), width, tree.max_depth)


class _LevelStep(NamedTuple):
    parent_nodes: torch.Tensor  # [n]: nodes of level d - 1 that have children at level d (node 0 = the root)
    child_index: torch.Tensor   # [m]: slot * width + rank of each node of level d (slot: its parent in parent_nodes;
                                # the level's nodes are contiguous, breadth-first, so they append in order)
    width: int                  # top-k needed at level d


def _transition_plan(tree: Tree, device) -> tuple[_LevelStep, ...]:
    node_of = {path: i + 1 for i, path in enumerate(tree.choices)}  # the tree's host data (no tensor reads)
    parents = [-1] + [node_of.get(path[:-1], 0) for path in tree.choices]
    depths = [0] + [len(path) for path in tree.choices]
    ranks = [0] + [path[-1] for path in tree.choices]
    steps = []
    for d in range(1, tree.max_depth + 1):
        nodes = [i for i in range(len(parents)) if depths[i] == d]
        parent_nodes = sorted({parents[i] for i in nodes})
        slot = {p: j for j, p in enumerate(parent_nodes)}
        width = max(ranks[i] for i in nodes) + 1
        steps.append(_LevelStep(torch.tensor(parent_nodes, device=device),
                                torch.tensor([slot[parents[i]] * width + ranks[i] for i in nodes], device=device),
                                width))
    return tuple(steps)


def _check_transition(transition, roots, level_logits: torch.Tensor) -> None:
    if not callable(transition):
        raise TypeError(f"transition must be a callable (prev_tokens [B, n], level) -> bias [B, n, V], got "
                        f"{type(transition).__name__}")
    if roots is None:
        raise ValueError("a transition needs the root tokens (the parents of level 1): pass roots=request.roots")
    if tuple(roots.shape) != (level_logits.shape[0],):
        raise ValueError(f"roots must have shape [B] = [{level_logits.shape[0]}], got {tuple(roots.shape)}")


def _biased(level_logits: torch.Tensor, transition: Transition, prev: torch.Tensor, d: int) -> torch.Tensor:
    bias = transition(prev, d)
    B, n, V = prev.shape[0], prev.shape[1], level_logits.shape[-1]
    if tuple(bias.shape) != (B, n, V):
        raise ValueError(f"transition(prev_tokens {tuple(prev.shape)}, {d}) returned shape {tuple(bias.shape)}; it "
                         f"must return the logit bias [B, n, V] = [{B}, {n}, {V}]")
    return level_logits[:, d - 1, None, :] + bias


def _draft_with_transition(level_logits: torch.Tensor, plan: _LevelPlan, steps: tuple[_LevelStep, ...],
                           transition: Transition, roots: torch.Tensor) -> Draft:
    B = level_logits.shape[0]
    node_tokens = [roots[:, None].to(torch.long)]                                  # per level: [B, m_d]
    for d in range(1, plan.depth + 1):
        step = steps[d - 1]
        held = torch.cat(node_tokens, 1)                                           # [B, nodes so far]
        prev = held[:, step.parent_nodes]                                          # [B, n]
        z = _biased(level_logits, transition, prev, d)                             # [B, n, V]
        if step.width == 1:
            top = z.argmax(-1, keepdim=True)                                       # a chain: sequential argmax
        else:
            top = z.topk(step.width, dim=-1).indices                               # [B, n, W]
        node_tokens.append(top.reshape(B, -1)[:, step.child_index])
    tokens = torch.cat(node_tokens[1:], 1)
    return Draft(tokens, plan.parents[None].expand(B, -1).clone(), plan.depths[None].expand(B, -1).clone(),
                 None, DraftScheme.DETERMINISTIC)


def _check(level_logits: torch.Tensor, tree: Tree, depth: int) -> Tree:
    if level_logits.dim() != 3:
        raise ValueError(f"level_logits must have shape [B, D, V], got {tuple(level_logits.shape)}")
    if not 1 <= depth <= tree.max_depth:
        raise ValueError(f"depth must lie in [1, {tree.max_depth}] (the tree's depth), got {depth}")
    if level_logits.shape[1] < depth:
        raise ValueError(f"the head gave {level_logits.shape[1]} levels but the tree is drafted to depth {depth}: "
                         f"prune the tree (tree.prune({level_logits.shape[1]})) or use a head with more levels")
    pruned = tree.prune(depth)
    width = 1 + max((path[-1] for path in pruned.choices), default=0)  # host data: no sync, no graph break
    if width > level_logits.shape[-1]:
        raise ValueError(f"the tree asks for rank {width - 1} but the vocabulary has {level_logits.shape[-1]} tokens")
    return pruned


def level_tree_draft(level_logits: torch.Tensor, tree, depth: int | None = None, *,
                     transition: Transition | None = None, roots: torch.Tensor | None = None) -> Draft:
    """Draft a level-wise tree from per-level logits: one ``topk`` over all levels, one gather.

    .. math:: \\mathrm{token}(r_1, \\dots, r_d) = \\mathrm{topk}(z_d)[r_d]

    With a ``transition`` ``t`` (DSpark's Markov head), the node with path ``(r_1, ..., r_d)`` whose parent holds
    token ``x`` (the root holds ``roots``) is

    .. math:: \\mathrm{token}(r_1, \\dots, r_d) = \\mathrm{topk}(z_d + t(x, d))[r_d]

    drafted level by level: one batched ``transition`` call per level over that level's parent nodes.

    Args:
        level_logits: draft logits of each level (level ``d`` is row ``d - 1``).
            Shape: ``[B, D, V]``.
        tree: tree choices or a compiled :class:`~specdec.trees.Tree`.
        depth: levels to draft (the tree is pruned to it); default the tree's depth.
        transition: ``transition(prev_tokens, d) -> bias`` or ``None`` (level-wise ranks, Medusa).
            Shape: ``prev_tokens [B, n]`` int64 -> ``bias [B, n, V]``.
        roots: the root token of each row, the parent of level 1 (needed with a ``transition``).
            Shape: ``[B]`` int64.

    Returns:
        A ``DETERMINISTIC`` :class:`~specdec.types.Draft`, every row the same tree shape.

    Example:
        >>> z = torch.tensor([[[0., 3., 1.], [2., 0., 1.]]])
        >>> level_tree_draft(z, [(0,), (1,), (0, 0)]).tokens.tolist()
        [[1, 2, 0]]

    References:
        Medusa arXiv 2401.10774 (``generate_candidates``); DSpark arXiv 2607.05147 (the Markov head).
    """
    tree = compile_tree(tree)
    depth = tree.max_depth if depth is None else depth
    pruned = _check(level_logits, tree, depth)
    plan = _plan(pruned, level_logits.device)
    if transition is None:
        return _draft(level_logits, plan)
    _check_transition(transition, roots, level_logits)
    return _draft_with_transition(level_logits, plan, _transition_plan(pruned, level_logits.device), transition,
                                  roots)


def _draft(level_logits: torch.Tensor, plan: _LevelPlan) -> Draft:
    B = level_logits.shape[0]
    top = level_logits[:, :plan.depth].topk(plan.width, dim=-1).indices          # [B, depth, W]
    tokens = top.reshape(B, -1)[:, plan.flat_index]                          # [B, N]
    return Draft(tokens, plan.parents[None].expand(B, -1).clone(), plan.depths[None].expand(B, -1).clone(),
                 None, DraftScheme.DETERMINISTIC)


def level_tree_draft_ref(level_logits: torch.Tensor, tree, depth: int | None = None, *,
                         transition: Transition | None = None, roots: torch.Tensor | None = None) -> Draft:
    """Reference twin of :func:`level_tree_draft`: per row and node, the rank-``r_d`` entry of a stable descending
    ``argsort`` of level ``d`` (identical to ``topk`` when no two logits of a level tie). With a ``transition``,
    one call per node (its parent's token in every row), in node order.

    Args:
        level_logits: Shape ``[B, D, V]``.
        tree: tree choices or a compiled tree.
        depth: levels to draft; default the tree's depth.
        transition: as in :func:`level_tree_draft`.
            Shape: ``prev_tokens [B, n]`` -> ``[B, n, V]``.
        roots: Shape ``[B]`` int64, needed with a ``transition``.

    Returns:
        A ``DETERMINISTIC`` :class:`~specdec.types.Draft`.
    """
    tree = compile_tree(tree)
    depth = tree.max_depth if depth is None else depth
    pruned = _check(level_logits, tree, depth)
    B = level_logits.shape[0]
    tokens = torch.zeros(B, pruned.num_nodes, dtype=torch.long, device=level_logits.device)
    if transition is not None:
        _check_transition(transition, roots, level_logits)
        held = torch.cat([roots[:, None].to(torch.long), tokens], 1)               # node i's token: held[:, i]
        parent_of = pruned.parents.tolist()
    for i, path in enumerate(pruned.choices):
        z = level_logits[:, len(path) - 1]                                         # [B, V]
        if transition is not None:
            z = z + transition(held[:, parent_of[i + 1], None], len(path))[:, 0]
        for b in range(B):
            tokens[b, i] = torch.argsort(z[b], descending=True, stable=True)[path[-1]]
        if transition is not None:
            held[:, i + 1] = tokens[:, i]
    parents, depths = pruned.expand(B, level_logits.device)
    return Draft(tokens, parents, depths, None, DraftScheme.DETERMINISTIC)


class LevelTree:
    """Medusa's tree policy: node ``(r_1, ..., r_d)`` is rank ``r_d`` of level ``d``'s distribution.

    Args:
        tree: tree choices (e.g. ``specdec.trees.MEDUSA_MC_SIM_7B_63``, or the output of
            :func:`specdec.trees.optimal_tree`) or a compiled :class:`~specdec.trees.Tree`. A step's ``K``
            prunes it to depth ``K``.

    Attributes:
        scheme: ``DETERMINISTIC``.
        tree: the compiled tree.

    Example:
        >>> policy = LevelTree([(0,), (1,), (0, 0)])
        >>> policy.draft(torch.randn(2, 2, 10), depth=2).tokens.shape
        torch.Size([2, 3])

    References:
        Medusa arXiv 2401.10774 (``medusa_choices``).
    """

    scheme = DraftScheme.DETERMINISTIC

    def __init__(self, tree):
        self.tree = compile_tree(tree)
        if self.tree.max_depth < 1:
            raise ValueError("the level tree has no draft node: give at least one path, e.g. [(0,)]")
        self._plans: dict = {}

    @classmethod
    def chain(cls, num_levels: int) -> LevelTree:
        """The chain of every level's top-1 (Medusa without tree attention; vLLM's Medusa proposer).

        Args:
            num_levels: ``D``, the chain's length.

        Returns:
            ``LevelTree(chain_tree(num_levels))``.
        """
        return cls(chain_tree(num_levels))

    def __repr__(self) -> str:
        return f"LevelTree({self.tree!r})"

    @property
    def max_depth(self) -> int:
        """Deepest level of the tree."""
        return self.tree.max_depth

    def draft(self, level_logits: torch.Tensor, depth: int | None = None, *,
              transition: Transition | None = None, roots: torch.Tensor | None = None) -> Draft:
        """Draft the tree (pruned to ``depth`` levels) from per-level logits.

        Without ``transition``: one ``topk`` and one gather (:func:`level_tree_draft`). With it, each node's
        children are the top ranks of ``z_d + transition(parent token, d)``: one batched ``transition`` call and
        one ``topk`` per level (a chain: one ``argmax`` per level).

        Args:
            level_logits: Shape ``[B, D, V]`` (``D >= depth``).
            depth: levels to draft; default the tree's depth.
            transition: ``transition(prev_tokens, d) -> bias`` (DSpark's Markov head) or ``None``.
                Shape: ``prev_tokens [B, n]`` int64 -> ``bias [B, n, V]``.
            roots: the root tokens, parents of level 1 (needed with ``transition``).
                Shape: ``[B]`` int64.

        Returns:
            A ``DETERMINISTIC`` :class:`~specdec.types.Draft` (index plans are built once per depth and device).

        References:
            Medusa arXiv 2401.10774; DSpark arXiv 2607.05147 (the Markov head).
        """
        depth = self.max_depth if depth is None else min(depth, self.max_depth)
        key = (depth, str(level_logits.device))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan(_check(level_logits, self.tree, depth), level_logits.device)
        elif level_logits.dim() != 3 or level_logits.shape[1] < depth or level_logits.shape[-1] < plan.width:
            _check(level_logits, self.tree, depth)  # raises the descriptive error
        if transition is None:
            return _draft(level_logits, plan)
        _check_transition(transition, roots, level_logits)
        steps = self._plans.get(key + ("transition",))
        if steps is None:
            steps = self._plans[key + ("transition",)] = _transition_plan(self.tree.prune(depth), level_logits.device)
        return _draft_with_transition(level_logits, plan, steps, transition, roots)


def as_level_policy(tree) -> LevelTree:
    """A :class:`LevelTree` from a policy, a compiled tree or tree choices.

    Args:
        tree: a :class:`LevelTree`, a :class:`~specdec.trees.Tree`, tree choices or their string form.

    Returns:
        A :class:`LevelTree`.
    """
    if isinstance(tree, LevelTree):
        return tree
    if isinstance(tree, (Tree, Sequence)):
        return LevelTree(tree)
    raise TypeError(f"tree must be a LevelTree, a compiled Tree or tree choices, got {type(tree).__name__}")
