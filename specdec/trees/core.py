"""Draft trees: compile tree choices once into a :class:`Tree`, plus per-row helpers for dynamic trees.

A tree is given by its *tree choices*: a list of paths from the root, each path a tuple of sibling ranks
(``0`` = the parent's most likely child, ``1`` = the second, ...). ``[(0,), (1,), (0, 0)]`` is a root with
two children, the first of which has one child. This is the format of EAGLE-1 and Medusa (``mc_sim_7b_63``)
and of vLLM's ``speculative_token_tree``. The root (node 0, the last committed token) is implicit.

Node numbering: node 0 is the root; nodes ``1..N`` are the paths sorted by ``(len(path), path)``, exactly as
vLLM sorts ``speculative_token_tree`` and as EAGLE-1 / Medusa sort their choices. Hence nodes are stored
breadth-first, every parent precedes its children, and the children of a node are contiguous and in rank
order.

Two layers:

- :class:`Tree` / :func:`compile_tree` / :func:`chain_tree`: one static tree, shared by every row of a batch,
  with every buffer precomputed (parents, depths, ranks, retrieve indices, ancestor mask).
- ``*_from_parents`` style helpers (:func:`depths_from_parents`, :func:`ancestor_matrix`,
  :func:`retrieve_paths`, :func:`validate_parents`) that take a batch of trees as a ``parents`` tensor
  ``[B, N + 1]`` (the :class:`specdec.types.Draft` layout), so dynamic trees (EAGLE-2), which differ per row,
  go through the same masks and verifiers. They run on the device of their input without host syncs
  (except :func:`validate_parents`, which must look at the values to raise).

References:
    - EAGLE: Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
      arXiv 2401.15077 (static tree ``mc_sim_7b_63``; EAGLE-2 dynamic trees: arXiv 2406.16858).
    - Medusa: Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads",
      arXiv 2401.10774 (``medusa_choices``, ``generate_medusa_buffers``).
    - SpecInfer: Miao et al., "SpecInfer: Accelerating Large Language Model Serving with Tree-based
      Speculative Inference and Verification", arXiv 2305.09781 (token trees, tree attention).
    - vLLM: ``speculative_token_tree`` and ``EagleProposer`` (``vllm/v1/spec_decode/eagle.py``).
"""
from __future__ import annotations

import ast
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Union

import torch

__all__ = [
    "Tree",
    "TreeChoices",
    "compile_tree",
    "chain_tree",
    "depths_from_parents",
    "ancestor_matrix",
    "retrieve_paths",
    "validate_parents",
    "EAGLE_MC_SIM_7B_63",
    "MEDUSA_MC_SIM_7B_63",
    "MEDUSA_VICUNA_7B_STAGE2",
    "MEDUSA_VICUNA_7B_STAGE1",
    "MEDUSA_VICUNA_7B_STAGE1_ABLATION",
    "MEDUSA_VICUNA_13B_STAGE2",
    "MEDUSA_VICUNA_13B_STAGE1",
    "MEDUSA_VICUNA_33B_STAGE2",
    "MEDUSA_VICUNA_33B_STAGE1",
    "MEDUSA_ZEPHYR_STAGE2",
    "TREE_PRESETS",
]

Path = tuple[int, ...]
#: What :func:`compile_tree` accepts: a sequence of paths (tuples or lists of ints), that sequence written
#: as a string Python literal, or an already compiled :class:`Tree`.
TreeChoices = Union[Sequence[Sequence[int]], str, "Tree"]

_EXAMPLE = '[(0,), (1,), (0, 0)]'


# --------------------------------------------------------------------------------------------------------
# Validation of tree choices
# --------------------------------------------------------------------------------------------------------


def _path_key(path: Path) -> tuple[int, Path]:
    # Breadth-first, then lexicographic: the order of vLLM's config post-init, EAGLE-1 and Medusa.
    return (len(path), path)


def _normalize_path(path: object, position: int) -> Path:
    if isinstance(path, (str, bytes)) or not isinstance(path, Sequence):
        raise ValueError(
            f"tree choices entry #{position} is {path!r}, not a path; write each path as a tuple of sibling "
            f"ranks, e.g. {_EXAMPLE}"
        )
    if len(path) == 0:
        raise ValueError(
            f"tree choices entry #{position} is an empty path (); the root is implicit and must not be "
            f"listed, remove it"
        )
    ranks = []
    for rank in path:
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
            raise ValueError(
                f"path {tuple(path)!r} (entry #{position}) has the rank {rank!r}, which is not an int; ranks "
                f"are ints >= 0 (0 = the parent's most likely child)"
            )
        if rank < 0:
            raise ValueError(
                f"path {tuple(path)!r} (entry #{position}) has the negative rank {rank}; ranks are ints >= 0 "
                f"(0 = the parent's most likely child)"
            )
        ranks.append(int(rank))
    return tuple(ranks)


def _resolve_device(device: torch.device | str) -> torch.device:
    # "cuda" means the current CUDA device; compare trees by the device their tensors really land on.
    return torch.empty(0, device=device).device


def _canonical_choices(choices: Sequence[object]) -> tuple[Path, ...]:
    """Validate tree choices and return them sorted by ``(len(path), path)``."""
    paths = [_normalize_path(p, i) for i, p in enumerate(choices)]
    first_seen: dict[Path, int] = {}
    duplicates = []
    for i, p in enumerate(paths):
        if p in first_seen:
            duplicates.append((p, first_seen[p], i))
        else:
            first_seen[p] = i
    if duplicates:
        p, a, b = min(duplicates, key=lambda d: _path_key(d[0]))
        raise ValueError(f"path {p!r} appears twice (entries #{a} and #{b}); remove the duplicate")
    ordered = tuple(sorted(first_seen, key=_path_key))
    present = set(ordered)
    for p in ordered:
        for cut in range(1, len(p)):
            if p[:cut] not in present:
                raise ValueError(
                    f"path {p!r} has no parent: its prefix {p[:cut]!r} is missing; every prefix of a path "
                    f"must be listed, so add {p[:cut]!r} or remove {p!r}"
                )
        for rank in range(p[-1]):
            sibling = p[:-1] + (rank,)
            if sibling not in present:
                raise ValueError(
                    f"path {p!r} skips rank {rank}: its sibling {sibling!r} is missing; sibling ranks must "
                    f"be 0, 1, 2, ... without gaps (rank r is the parent's (r+1)-th most likely child), so "
                    f"add {sibling!r} or renumber {p!r}"
                )
    return ordered


# --------------------------------------------------------------------------------------------------------
# The compiled tree
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Tree:
    """An immutable compiled draft tree: tree choices plus every buffer a step needs, computed once.

    Build it with :func:`compile_tree` (any order, string form, errors that name the bad path) or
    :func:`chain_tree`. Node 0 is the root; node ``i >= 1`` is ``choices[i - 1]``; ``choices`` is sorted by
    ``(len(path), path)`` so nodes are breadth-first, parents precede children, and each node's children
    are contiguous and in rank order. Two trees are equal (and hash equal) iff their choices are equal,
    whatever device their tensors are on. Its tensors are shared, never copied: do not modify them in place.

    A tree may be *root-only* (``choices == ()``, ``N = 0``, ``D = 0``): :func:`chain_tree` ``(0)`` or
    ``prune(0)``, a plain decoding step (K = 0) in the same layout.

    Attributes:
        choices: the sorted paths, a tuple of tuples of ints; ``choices[i - 1]`` is the path of node ``i``.
        device: the device of the tensors (CPU unless :meth:`to` moved them).

    Tensor properties (all int64 unless stated, on :attr:`device`):
        parents: Shape ``[N + 1]``, parent node of each node, ``-1`` for the root.
        depths: Shape ``[N + 1]``, level of each node, root 0 (also :attr:`position_offsets`).
        ranks: Shape ``[N + 1]``, sibling rank of each node (last entry of its path), root 0.
        num_children: Shape ``[N + 1]``, exact number of children of each node.
        leaves: Shape ``[num_leaves]``, the leaf nodes in the order of the rows of :attr:`retrieve_indices`
            (the root alone is the single leaf of a root-only tree).
        retrieve_indices: Shape ``[num_leaves, D + 1]``, one row per leaf: the node indices of its
            root-to-leaf path (column 0 is the root, 0), padded with ``-1``. Rows follow the *EAGLE order*:
            sorted lexicographically by node index, which here equals depth-first order of the leaves'
            paths (rank 0 branches first), so a verifier scanning rows meets siblings in rank order. Medusa's
            ``generate_medusa_buffers`` lists the same rows in another order (deepest, last sorted leaf
            first); the set of rows is identical.
        ancestor_mask: Shape ``[N + 1, N + 1]`` bool, ``[i, j]`` is True iff ``j`` is ``i`` or an ancestor of
            ``i`` (the tree part of the attention mask; row ``i`` is what node ``i`` attends to).

    Per-level counts (Python tuples of length ``D``; index ``l`` is level ``l + 1``):
        num_drafts_per_level, cu_drafts_per_level, child_drafts_per_level: as vLLM's ``EagleProposer``
        defines them (see the properties).

    Example:
        >>> tree = compile_tree([(0,), (1,), (0, 0)])
        >>> tree.parents.tolist(), tree.depths.tolist()
        ([-1, 0, 0, 1], [0, 1, 1, 2])
        >>> tree.retrieve_indices.tolist()
        [[0, 1, 3], [0, 2, -1]]

    References:
        EAGLE arXiv 2401.15077 (``generate_tree_buffers``); Medusa arXiv 2401.10774
        (``generate_medusa_buffers``); SpecInfer arXiv 2305.09781; vLLM ``speculative_token_tree``.
    """

    choices: tuple[Path, ...]
    device: torch.device = field(default=torch.device("cpu"))

    def __post_init__(self) -> None:
        choices = _canonical_choices(self.choices)
        object.__setattr__(self, "choices", choices)
        object.__setattr__(self, "device", _resolve_device(self.device))
        node_of = {p: i + 1 for i, p in enumerate(choices)}
        parents = [-1] + [node_of.get(p[:-1], 0) for p in choices]
        num_children = [0] * (len(choices) + 1)
        for p in parents[1:]:
            num_children[p] += 1
        depth = max((len(p) for p in choices), default=0)

        # EAGLE order: leaves by path, lexicographically (= rows sorted by node index, see the docstring).
        leaf_paths = sorted(p for p in choices if num_children[node_of[p]] == 0) or [()]
        rows = [[0] + [node_of[p[:d]] for d in range(1, len(p) + 1)] for p in leaf_paths]
        rows = [r + [-1] * (depth + 1 - len(r)) for r in rows]

        drafts = tuple(sum(1 for p in choices if len(p) == d) for d in range(1, depth + 1))
        cu = tuple(sum(drafts[: d + 1]) for d in range(depth))
        # vLLM: child_drafts_per_level[0] = drafts at level 1, [l] = int(drafts[l] / drafts[l - 1]).
        child = tuple(drafts[:1]) + tuple(int(drafts[d] / drafts[d - 1]) for d in range(1, depth))
        uniform = all(
            num_children[n] == child[len(p)]
            for n, p in [(0, ())] + [(node_of[p], p) for p in choices]
            if len(p) < depth
        )

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long)

        parents_t = tensor(parents)
        buffers = {
            "parents": parents_t,
            "depths": tensor([0] + [len(p) for p in choices]),
            "ranks": tensor([0] + [p[-1] for p in choices]),
            "num_children": tensor(num_children),
            "leaves": tensor([r[len(p)] for r, p in zip(rows, leaf_paths)]),
            "retrieve_indices": tensor(rows).reshape(len(rows), depth + 1),
            "ancestor_mask": ancestor_matrix(parents_t[None])[0],
        }
        object.__setattr__(self, "_buffers", {k: v.to(self.device) for k, v in buffers.items()})
        object.__setattr__(self, "_counts", (drafts, cu, child, uniform))

    # ---- identity --------------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return self.choices == other.choices

    def __hash__(self) -> int:
        return hash(self.choices)

    def __repr__(self) -> str:
        return (
            f"Tree(num_nodes={self.num_nodes}, max_depth={self.max_depth}, "
            f"num_drafts_per_level={self.num_drafts_per_level}, num_leaves={self.num_leaves}, "
            f"device={str(self.device)!r})"
        )

    # ---- sizes -----------------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """``N``: draft nodes, the root excluded."""
        return len(self.choices)

    @property
    def max_depth(self) -> int:
        """``D``: the deepest level (0 for a root-only tree)."""
        return len(self._counts[0])

    @property
    def num_leaves(self) -> int:
        """Number of leaves, i.e. rows of :attr:`retrieve_indices`."""
        return int(self._buffers["leaves"].shape[0])

    @property
    def num_drafts_per_level(self) -> tuple[int, ...]:
        """Draft nodes at each level: entry ``l`` counts the paths of length ``l + 1`` (vLLM's definition)."""
        return self._counts[0]

    @property
    def cu_drafts_per_level(self) -> tuple[int, ...]:
        """Inclusive cumulative sum of :attr:`num_drafts_per_level` (vLLM): nodes at levels ``1..l + 1``."""
        return self._counts[1]

    @property
    def child_drafts_per_level(self) -> tuple[int, ...]:
        """Children per parent at each level, exactly as vLLM's ``EagleProposer`` computes it.

        Entry 0 is the number of level-1 drafts (the root's children); entry ``l`` is
        ``int(num_drafts_per_level[l] / num_drafts_per_level[l - 1])``. This assumes a *uniform fan-out*:
        every node of level ``l`` has the same number of children. That holds for chains and full
        k-ary trees but not for EAGLE's or Medusa's ``mc_sim_7b_63`` (see :attr:`uniform_fan_out`); use
        :attr:`num_children` for the exact per-node count.
        """
        return self._counts[2]

    @property
    def uniform_fan_out(self) -> bool:
        """True iff every node above the last level has exactly ``child_drafts_per_level[depth]`` children.

        vLLM's level-by-level ``propose_tree`` can only draft trees for which this is True.
        """
        return self._counts[3]

    # ---- tensors ---------------------------------------------------------------------------------------

    @property
    def parents(self) -> torch.Tensor:
        """Shape ``[N + 1]`` int64: parent node of each node, ``-1`` for the root."""
        return self._buffers["parents"]

    @property
    def depths(self) -> torch.Tensor:
        """Shape ``[N + 1]`` int64: level of each node, root 0."""
        return self._buffers["depths"]

    @property
    def position_offsets(self) -> torch.Tensor:
        """Shape ``[N + 1]`` int64: position of each node relative to the root (= :attr:`depths`)."""
        return self._buffers["depths"]

    @property
    def ranks(self) -> torch.Tensor:
        """Shape ``[N + 1]`` int64: sibling rank of each node (0 = its parent's most likely child), root 0."""
        return self._buffers["ranks"]

    @property
    def num_children(self) -> torch.Tensor:
        """Shape ``[N + 1]`` int64: exact number of children of each node."""
        return self._buffers["num_children"]

    @property
    def leaves(self) -> torch.Tensor:
        """Shape ``[num_leaves]`` int64: leaf nodes, in the order of the rows of :attr:`retrieve_indices`."""
        return self._buffers["leaves"]

    @property
    def retrieve_indices(self) -> torch.Tensor:
        """Shape ``[num_leaves, D + 1]`` int64: root-to-leaf node paths, ``-1`` padded, EAGLE row order."""
        return self._buffers["retrieve_indices"]

    @property
    def ancestor_mask(self) -> torch.Tensor:
        """Shape ``[N + 1, N + 1]`` bool: ``[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``."""
        return self._buffers["ancestor_mask"]

    # ---- derived trees and layouts ---------------------------------------------------------------------

    def to(self, device: torch.device | str) -> Tree:
        """Return the same tree with its tensors on ``device`` (``self`` if they already are there).

        Args:
            device: target device, e.g. ``"cuda"``. Move a tree once, not every step.

        Returns:
            A :class:`Tree` equal to ``self``.
        """
        if _resolve_device(device) == self.device:
            return self
        return replace(self, device=device)

    def prune(self, max_depth: int) -> Tree:
        """Keep the nodes of depth ``<= max_depth``: bounds a static tree by a per-step K.

        Args:
            max_depth: the deepest level to keep, ``>= 0``; 0 gives the root-only tree.

        Returns:
            A :class:`Tree` (``self`` when nothing is cut). Node indices of kept nodes are unchanged, since
            breadth-first order puts every kept node before every cut one.

        Example:
            >>> compile_tree([(0,), (0, 0), (0, 0, 0)]).prune(2).choices
            ((0,), (0, 0))
        """
        if isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral) or max_depth < 0:
            raise ValueError(f"max_depth must be an int >= 0 (0 keeps only the root), got {max_depth!r}")
        if max_depth >= self.max_depth:
            return self
        return Tree(tuple(p for p in self.choices if len(p) <= max_depth), device=self.device)

    def expand(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Lay the tree out for a batch in the :class:`specdec.types.Draft` layout (every row the same tree).

        Args:
            batch_size: ``B``, the number of rows, ``>= 1``.
            device: where to put the result (default: the tree's device).

        Returns:
            ``(parents, depths)``, each of shape ``[B, N + 1]`` int64, fresh contiguous tensors (safe to
            modify, e.g. to mark a row's nodes absent with parent ``-1`` and depth 0).

        Example:
            >>> parents, depths = chain_tree(2).expand(3)
            >>> parents.shape, depths[0].tolist()
            (torch.Size([3, 3]), [0, 1, 2])
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        device = self.device if device is None else torch.device(device)
        shape = (int(batch_size), self.num_nodes + 1)
        return (
            self.parents.to(device)[None].expand(shape).clone(),
            self.depths.to(device)[None].expand(shape).clone(),
        )


def compile_tree(choices: TreeChoices, *, device: torch.device | str | None = None) -> Tree:
    """Compile tree choices (paths of sibling ranks) into a :class:`Tree`; validate them with clear errors.

    The order of the paths does not matter (they are sorted by ``(len(path), path)``); paths may be tuples
    or lists; the whole list may be given as its string Python literal (vLLM's ``speculative_token_tree``).

    Rules (each violation raises ``ValueError`` naming the path and the fix): at least one path; no empty
    path (the root is implicit); ranks are ints ``>= 0``; no duplicate path; every prefix of a path is
    itself a path (no missing parent); sibling ranks have no gaps: ``(2,)`` needs ``(1,)`` and ``(0,)``,
    because rank ``r`` *means* the parent's ``(r + 1)``-th most likely child, and a drafter that proposes
    the top-3 children always has the top-1 and top-2.

    Args:
        choices: a sequence of paths, e.g. ``[(0,), (1,), (0, 0)]``; or its string form
            ``"[(0,), (1,), (0, 0)]"``; or a :class:`Tree` (returned as is, moved to ``device`` if given).
        device: where to put the tree's tensors (default CPU).

    Returns:
        The compiled :class:`Tree`.

    Example:
        >>> tree = compile_tree("[(0,), (1,), (0, 0), (0, 1)]")
        >>> tree.num_drafts_per_level, tree.cu_drafts_per_level, tree.child_drafts_per_level
        ((2, 2), (2, 4), (2, 1))
        >>> tree.num_children.tolist()
        [2, 2, 0, 0, 0]

    References:
        EAGLE arXiv 2401.15077; Medusa arXiv 2401.10774; SpecInfer arXiv 2305.09781; vLLM
        ``speculative_token_tree`` (sorted with the key ``(len(path), path)``).
    """
    if isinstance(choices, Tree):
        return choices if device is None else choices.to(device)
    if isinstance(choices, str):
        try:
            parsed = ast.literal_eval(choices.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
            raise ValueError(
                f"could not parse the tree choices string {choices!r} ({type(err).__name__}: {err}); write a "
                f"Python literal list of tuples such as {_EXAMPLE!r}"
            ) from None
        choices = parsed
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise ValueError(
            f"tree choices must be a list of paths (tuples of sibling ranks) or its string form, got "
            f"{type(choices).__name__}; e.g. {_EXAMPLE}"
        )
    if len(choices) == 0:
        raise ValueError(
            "tree choices are empty; give at least one path such as [(0,)] (for a plain decoding step with "
            "no drafts use chain_tree(0))"
        )
    return Tree(tuple(choices), device=torch.device("cpu") if device is None else device)


def chain_tree(num_drafts: int, *, device: torch.device | str | None = None) -> Tree:
    """The chain of ``K`` drafts as a tree: ``[(0,), (0, 0), ...]`` of depth ``K`` (vLLM's default tree).

    Args:
        num_drafts: ``K >= 0``; 0 gives the root-only tree (a plain decoding step).
        device: where to put the tree's tensors (default CPU).

    Returns:
        A :class:`Tree` equal to ``compile_tree([(0,) * d for d in range(1, K + 1)])``; node ``i`` is the
        ``i``-th draft and its parent is node ``i - 1``.

    Example:
        >>> chain_tree(3).choices
        ((0,), (0, 0), (0, 0, 0))

    References:
        Leviathan et al. arXiv 2211.17192 (chain drafts); vLLM ``SpeculativeConfig`` (chain when no tree is
        given).
    """
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, numbers.Integral) or num_drafts < 0:
        raise ValueError(f"num_drafts must be an int >= 0 (0 = no drafts), got {num_drafts!r}")
    return Tree(tuple((0,) * d for d in range(1, int(num_drafts) + 1)),
                device=torch.device("cpu") if device is None else device)


# --------------------------------------------------------------------------------------------------------
# Per-row helpers: a batch of (possibly different) trees given by their parents
# --------------------------------------------------------------------------------------------------------


def _check_parents_shape(parents: torch.Tensor, name: str = "parents") -> torch.Tensor:
    if not isinstance(parents, torch.Tensor):
        raise TypeError(
            f"{name} must be a tensor of shape [B, N + 1] (use Tree.expand(B) for a static tree), "
            f"got {type(parents).__name__}"
        )
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(
            f"{name} must have shape [B, N + 1] with node 0 the root, got {tuple(parents.shape)}; add a "
            f"batch dimension with {name}[None] for a single tree"
        )
    if parents.dtype.is_floating_point or parents.dtype.is_complex or parents.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer node indices (int64), got dtype {parents.dtype}")
    return parents.long()


def _jump_pointers(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # One step towards the root; the root and absent nodes point to themselves (a fixed point).
    nodes = torch.arange(parents.shape[1], device=parents.device)
    has_parent = (parents >= 0) & (nodes > 0)
    return torch.where(has_parent, parents, nodes), has_parent


def _num_doublings(num_nodes_with_root: int) -> int:
    # Depth is at most N, and k rounds of pointer doubling follow 2**k edges.
    n = num_nodes_with_root - 1
    return 0 if n <= 1 else math.ceil(math.log2(n))


def depths_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node of a batch of trees given by their parents (root and absent nodes: 0).

    Pointer doubling: ``ceil(log2 N)`` rounds of gathers, a count known from the shape, so no host sync.

    Args:
        parents: Shape ``[B, N + 1]`` int64, parent of each node; node 0 is the root; ``-1`` for the root
            and for absent nodes. Must satisfy :func:`validate_parents` (not checked here).

    Returns:
        Shape ``[B, N + 1]`` int64 depths, on the device of ``parents``.

    Example:
        >>> depths_from_parents(torch.tensor([[-1, 0, 1, 0, -1]])).tolist()
        [[0, 1, 2, 1, 0]]

    References:
        EAGLE-2 arXiv 2406.16858 (per-step trees, position ids = depth); SGLang
        ``build_tree_kernel_efficient``.
    """
    parents = _check_parents_shape(parents)
    jump, has_parent = _jump_pointers(parents)
    depth = has_parent.long()
    for _ in range(_num_doublings(parents.shape[1])):
        depth = depth + torch.gather(depth, 1, jump)
        jump = torch.gather(jump, 1, jump)
    return depth


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self relation of a batch of trees: ``[b, i, j]`` iff ``j`` is ``i`` or ``i``'s ancestor.

    This is the tree part of the tree-attention mask (row ``i`` = the nodes node ``i`` may attend to).
    Absent nodes (parent ``-1``, index ``> 0``) relate only to themselves, so no mask row is empty. Built by
    pointer doubling (``ceil(log2 N)`` rounds, a count known from the shape), with no host sync.

    Args:
        parents: Shape ``[B, N + 1]`` int64, parent of each node; ``-1`` for the root (node 0) and absent
            nodes. Must satisfy :func:`validate_parents` (not checked here).

    Returns:
        Shape ``[B, N + 1, N + 1]`` bool, on the device of ``parents``.

    Example:
        >>> ancestor_matrix(torch.tensor([[-1, 0, 1]]))[0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]

    References:
        SpecInfer arXiv 2305.09781 (topology-aware causal mask); EAGLE arXiv 2401.15077 (``tree_attn_mask``);
        Medusa arXiv 2401.10774 (``medusa_attn_mask``); vLLM ``tree_attn`` backend
        (``_prepare_tree_attn_bias``).
    """
    parents = _check_parents_shape(parents)
    batch, width = parents.shape
    jump, _ = _jump_pointers(parents)
    nodes = torch.arange(width, device=parents.device)
    # Invariant after k rounds: anc[b, i] = nodes within 2**k steps up from i; jump[b, i] = the 2**k-th one.
    anc = (nodes[:, None] == nodes[None, :])[None] | (jump[:, :, None] == nodes[None, None, :])
    for _ in range(_num_doublings(width)):
        anc = anc | torch.gather(anc, 1, jump[:, :, None].expand(batch, width, width))
        jump = torch.gather(jump, 1, jump)
    return anc


def retrieve_paths(parents: torch.Tensor, max_depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Root-to-node path of every node of a batch of trees, and which nodes are leaves.

    The per-row generalisation of :attr:`Tree.retrieve_indices`: that tensor is
    ``paths[0, tree.leaves, : D + 1]`` for ``parents = tree.parents[None]``.

    Args:
        parents: Shape ``[B, N + 1]`` int64 (see :func:`ancestor_matrix`).
        max_depth: ``D``, an upper bound on every row's depth, to keep the output narrow; default ``N``
            (always safe). A smaller bound than a row's true depth silently drops the deeper entries.

    Returns:
        ``(paths, is_leaf)``:
        ``paths``: Shape ``[B, N + 1, W]`` int64 with ``W = max_depth + 1``: ``paths[b, i, d]`` is the
        ancestor of node ``i`` at depth ``d`` (``paths[b, i, 0] = 0``, ``paths[b, i, depth(i)] = i``),
        ``-1`` beyond the node's depth and on whole rows of absent nodes.
        ``is_leaf``: Shape ``[B, N + 1]`` bool, present nodes without children (the root when it has none).

    Example:
        >>> paths, is_leaf = retrieve_paths(torch.tensor([[-1, 0, 0, 1]]))
        >>> paths[0][is_leaf[0]].tolist()
        [[0, 2, -1, -1], [0, 1, 3, -1]]

    References:
        EAGLE arXiv 2401.15077 / Medusa arXiv 2401.10774 (``retrieve_indices``); SGLang
        ``build_tree_kernel_efficient`` (per-row trees).
    """
    parents = _check_parents_shape(parents)
    batch, width = parents.shape
    depth_bound = width - 1 if max_depth is None else int(max_depth)
    if depth_bound < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth!r}")
    nodes = torch.arange(width, device=parents.device)
    present = (parents >= 0) | (nodes == 0)
    anc = ancestor_matrix(parents) & present[:, None, :]
    depth = depths_from_parents(parents)
    # Each present ancestor j of i lands in column depth(j); every other j writes -1, which amax ignores.
    values = torch.where(anc, nodes.expand(batch, width, width), -1)
    columns = depth[:, None, :].clamp(max=depth_bound).expand(batch, width, width)
    values = torch.where(depth[:, None, :] <= depth_bound, values, -1)
    paths = torch.full((batch, width, depth_bound + 1), -1, dtype=torch.long, device=parents.device)
    paths = paths.scatter_reduce(2, columns, values, reduce="amax", include_self=True)
    paths = torch.where(present[:, :, None], paths, -1)
    has_child = torch.zeros((batch, width + 1), dtype=torch.bool, device=parents.device)
    # Absent nodes' -1 parents are sent to a spare column (width) that is dropped.
    has_child = has_child.scatter(1, torch.where(parents >= 0, parents, width), True)[:, :width]
    return paths, present & ~has_child


def validate_parents(parents: torch.Tensor) -> None:
    """Check that ``parents`` describes a batch of valid trees in the ``Draft`` layout; raise if not.

    Rules: shape ``[B, N + 1]`` of integers; ``parents[b, 0] == -1`` (node 0 is the root); every other
    entry is ``-1`` (absent node) or a node index ``< i`` (parents precede children, breadth-first); the
    parent of a present node is present. This reads the values, so it synchronises with the device: call
    it in tests and when debugging a drafter, not in the decoding loop.

    Args:
        parents: Shape ``[B, N + 1]`` int64.

    Returns:
        None; raises ``ValueError`` naming the first bad row and node and the fix.

    Example:
        >>> validate_parents(torch.tensor([[-1, 0, 2]]))
        Traceback (most recent call last):
        ...
        ValueError: parents[0, 2] = 2, but a node's parent must come before it (parent index < 2); ...

    References:
        vLLM / SGLang tree layouts (breadth-first, parents first); SGLang's "invalid eagle tree" check.
    """
    parents = _check_parents_shape(parents)
    width = parents.shape[1]
    nodes = torch.arange(width, device=parents.device)
    root_bad = parents[:, 0] != -1
    if bool(root_bad.any()):
        b = int(root_bad.nonzero()[0, 0])
        raise ValueError(
            f"parents[{b}, 0] = {int(parents[b, 0])}, but node 0 is the root and its parent must be -1"
        )
    below = parents < -1
    if bool(below.any()):
        b, i = (int(x) for x in below.nonzero()[0])
        raise ValueError(
            f"parents[{b}, {i}] = {int(parents[b, i])}; use -1 for an absent node, otherwise a node "
            f"index >= 0"
        )
    late = (parents >= nodes) & (nodes > 0)
    if bool(late.any()):
        b, i = (int(x) for x in late.nonzero()[0])
        raise ValueError(
            f"parents[{b}, {i}] = {int(parents[b, i])}, but a node's parent must come before it (parent "
            f"index < {i}); store nodes breadth-first, parents first"
        )
    parent_absent = torch.gather(parents, 1, parents.clamp(min=0)) == -1
    orphan = (parents > 0) & parent_absent
    if bool(orphan.any()):
        b, i = (int(x) for x in orphan.nonzero()[0])
        p = int(parents[b, i])
        raise ValueError(
            f"parents[{b}, {i}] = {p}, but node {p} of row {b} is absent (its parent is -1); a present node "
            f"needs a present parent: mark node {i} absent too (parent -1) or fix node {p}'s parent"
        )


# --------------------------------------------------------------------------------------------------------
# Presets (published tree choices, in their published order)
# --------------------------------------------------------------------------------------------------------

#: EAGLE-1's static tree ``mc_sim_7b_63`` (SafeAILab/EAGLE, ``choices.py``): 25 nodes, 4/8/8/3/2 per level,
#: depth 5, 15 leaves, ``TOPK = 10``. The name is inherited from Medusa; the tree is not Medusa's.
EAGLE_MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (0, 0, 0),
    (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1),
    (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)

#: Medusa's default tree ``mc_sim_7b_63`` (FasterDecoding/Medusa ``medusa_choices.py``; used by Spec-Bench):
#: 63 nodes, 10/28/23/2 per level, 42 leaves. Listed in Medusa's order (the order its greedy search added
#: the nodes); :func:`compile_tree` sorts it.
MEDUSA_MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,),
    (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0),
    (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0),
    (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1),
    (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

#: Medusa ``vicuna_7b_stage2`` (``medusa_choices.py``): 63 nodes, 10/23/23/7 per level, 42 leaves.
MEDUSA_VICUNA_7B_STAGE2: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (0, 0, 0), (1, 0), (2,), (0, 2), (0, 0, 1), (0, 3), (3,), (0, 1, 0), (2, 0),
    (4,), (0, 0, 2), (0, 4), (1, 1), (1, 0, 0), (0, 0, 0, 0), (5,), (0, 0, 3), (0, 5), (0, 2, 0), (3, 0),
    (0, 1, 1), (0, 6), (6,), (0, 7), (0, 0, 4), (4, 0), (1, 2), (0, 8), (7,), (0, 3, 0), (0, 0, 0, 1),
    (0, 0, 5), (2, 1), (0, 0, 6), (1, 0, 1), (0, 0, 1, 0), (2, 0, 0), (5, 0), (0, 9), (0, 1, 2), (8,),
    (0, 4, 0), (0, 2, 1), (1, 3), (0, 0, 7), (0, 0, 0, 2), (0, 0, 8), (1, 1, 0), (0, 1, 0, 0), (6, 0), (9,),
    (0, 1, 3), (0, 0, 0, 3), (1, 0, 2), (0, 5, 0), (3, 1), (0, 0, 2, 0), (7, 0), (1, 4),
)

#: Medusa ``vicuna_7b_stage1`` (``medusa_choices.py``): 63 nodes, 10/32/20/1 per level, 44 leaves.
MEDUSA_VICUNA_7B_STAGE1: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (2,), (0, 1), (1, 0), (3,), (0, 2), (4,), (0, 0, 0), (0, 3), (5,), (2, 0), (0, 4),
    (6,), (0, 5), (1, 1), (0, 0, 1), (7,), (3, 0), (0, 6), (8,), (9,), (0, 1, 0), (0, 7), (0, 8), (4, 0),
    (0, 0, 2), (1, 2), (0, 9), (2, 1), (5, 0), (1, 0, 0), (0, 0, 3), (1, 3), (0, 2, 0), (0, 1, 1),
    (0, 0, 4), (6, 0), (1, 4), (0, 0, 5), (2, 2), (0, 3, 0), (3, 1), (0, 0, 6), (7, 0), (1, 5), (1, 0, 1),
    (2, 0, 0), (0, 0, 7), (8, 0), (0, 0, 0, 0), (4, 1), (0, 1, 2), (0, 4, 0), (9, 0), (0, 2, 1), (2, 3),
    (1, 6), (0, 0, 8), (0, 5, 0), (3, 2), (5, 1),
)

#: Medusa ``vicuna_7b_stage1_ablation`` (``medusa_choices.py``): 63 nodes, 10/21/25/7 per level, 42 leaves.
MEDUSA_VICUNA_7B_STAGE1_ABLATION: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 0, 0), (0, 1), (1, 0), (2,), (0, 2), (0, 0, 1), (3,), (0, 3), (0, 1, 0), (2, 0),
    (0, 0, 2), (0, 4), (4,), (0, 0, 0, 0), (1, 0, 0), (1, 1), (0, 0, 3), (0, 2, 0), (0, 5), (5,), (3, 0),
    (0, 1, 1), (0, 6), (6,), (0, 0, 4), (1, 2), (0, 0, 0, 1), (4, 0), (0, 0, 5), (0, 7), (0, 8), (0, 3, 0),
    (0, 0, 1, 0), (1, 0, 1), (7,), (2, 0, 0), (0, 0, 6), (2, 1), (0, 1, 2), (5, 0), (0, 2, 1), (0, 9),
    (0, 0, 0, 2), (0, 4, 0), (8,), (1, 3), (0, 0, 7), (0, 1, 0, 0), (1, 1, 0), (6, 0), (9,), (0, 0, 8),
    (0, 0, 9), (0, 5, 0), (0, 0, 2, 0), (1, 0, 2), (0, 1, 3), (0, 0, 0, 3), (3, 0, 0), (3, 1),
)

#: Medusa ``vicuna_13b_stage2`` (``medusa_choices.py``): 63 nodes, 10/19/25/9 per level, 42 leaves.
MEDUSA_VICUNA_13B_STAGE2: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 0, 0), (0, 1), (1, 0), (2,), (0, 2), (0, 0, 1), (0, 1, 0), (3,), (0, 3), (2, 0),
    (0, 0, 2), (0, 0, 0, 0), (0, 4), (1, 0, 0), (1, 1), (4,), (0, 0, 3), (0, 5), (0, 2, 0), (5,), (3, 0),
    (0, 1, 1), (0, 6), (0, 0, 4), (0, 0, 0, 1), (0, 7), (0, 0, 5), (1, 2), (0, 0, 1, 0), (0, 3, 0),
    (1, 0, 1), (4, 0), (0, 0, 6), (0, 8), (2, 0, 0), (0, 9), (6,), (7,), (2, 1), (5, 0), (0, 1, 2),
    (0, 0, 0, 2), (8,), (0, 4, 0), (0, 1, 0, 0), (0, 2, 1), (0, 0, 7), (1, 1, 0), (1, 3), (0, 0, 2, 0),
    (9,), (0, 0, 8), (0, 5, 0), (0, 0, 0, 3), (0, 0, 9), (0, 1, 3), (1, 0, 2), (0, 0, 1, 1), (3, 0, 0),
    (1, 0, 0, 0),
)

#: Medusa ``vicuna_13b_stage1`` (``medusa_choices.py``): 63 nodes, 10/29/23/1 per level, 44 leaves.
MEDUSA_VICUNA_13B_STAGE1: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (1, 0), (0, 0, 0), (0, 2), (3,), (0, 3), (4,), (2, 0), (0, 4),
    (0, 0, 1), (0, 5), (5,), (1, 1), (0, 1, 0), (6,), (0, 6), (0, 0, 2), (7,), (3, 0), (8,), (0, 7), (0, 8),
    (1, 0, 0), (0, 0, 3), (4, 0), (1, 2), (9,), (0, 9), (2, 1), (0, 2, 0), (0, 0, 4), (1, 3), (0, 1, 1),
    (0, 0, 5), (5, 0), (0, 3, 0), (0, 0, 0, 0), (0, 0, 6), (6, 0), (1, 4), (2, 0, 0), (0, 1, 2), (3, 1),
    (0, 4, 0), (1, 0, 1), (2, 2), (0, 0, 7), (1, 5), (7, 0), (0, 0, 8), (8, 0), (0, 5, 0), (0, 0, 9),
    (0, 2, 1), (1, 1, 0), (0, 1, 3), (4, 1), (2, 3), (1, 6),
)

#: Medusa ``vicuna_33b_stage2`` (``medusa_choices.py``): 63 nodes, 10/24/24/5 per level, 43 leaves.
MEDUSA_VICUNA_33B_STAGE2: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (0, 0, 0), (1, 0), (2,), (0, 2), (0, 0, 1), (0, 3), (3,), (0, 1, 0), (2, 0),
    (0, 4), (4,), (0, 0, 2), (1, 1), (1, 0, 0), (0, 5), (5,), (0, 0, 0, 0), (0, 0, 3), (3, 0), (0, 2, 0),
    (0, 6), (0, 1, 1), (6,), (0, 0, 4), (0, 7), (7,), (1, 2), (4, 0), (8,), (0, 3, 0), (0, 0, 5),
    (0, 0, 0, 1), (0, 8), (2, 1), (0, 9), (1, 0, 1), (2, 0, 0), (0, 0, 6), (5, 0), (0, 0, 1, 0), (1, 3),
    (0, 1, 2), (0, 4, 0), (0, 0, 7), (0, 2, 1), (9,), (1, 1, 0), (0, 0, 0, 2), (6, 0), (0, 0, 8),
    (0, 1, 0, 0), (7, 0), (0, 1, 3), (0, 5, 0), (1, 4), (0, 0, 9), (3, 1), (1, 0, 2), (2, 2),
)

#: Medusa ``vicuna_33b_stage1`` (``medusa_choices.py``): 63 nodes, 10/34/19 (depth 3) per level, 46 leaves.
MEDUSA_VICUNA_33B_STAGE1: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (0, 0), (2,), (0, 1), (3,), (1, 0), (4,), (0, 2), (5,), (0, 3), (0, 0, 0), (6,), (0, 4),
    (2, 0), (7,), (1, 1), (0, 5), (3, 0), (8,), (9,), (0, 6), (0, 7), (0, 0, 1), (1, 2), (4, 0), (0, 1, 0),
    (0, 8), (0, 9), (2, 1), (0, 0, 2), (5, 0), (1, 3), (0, 0, 3), (1, 0, 0), (1, 4), (6, 0), (0, 2, 0),
    (3, 1), (2, 2), (0, 0, 4), (7, 0), (0, 1, 1), (1, 5), (4, 1), (0, 0, 5), (0, 3, 0), (9, 0), (8, 0),
    (1, 6), (0, 0, 6), (2, 3), (0, 1, 2), (3, 2), (0, 4, 0), (2, 0, 0), (1, 7), (1, 0, 1), (0, 0, 7),
    (5, 1), (2, 4), (0, 0, 8), (0, 2, 1),
)

#: Medusa ``zephyr_stage2`` (``medusa_choices.py``): 63 nodes, 10/27/23/3 per level, 44 leaves.
MEDUSA_ZEPHYR_STAGE2: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (2, 0), (0, 0, 1),
    (0, 4), (5,), (0, 5), (0, 1, 0), (1, 1), (6,), (0, 0, 2), (3, 0), (0, 6), (7,), (0, 7), (0, 8),
    (0, 0, 3), (1, 0, 0), (0, 9), (0, 2, 0), (1, 2), (4, 0), (8,), (9,), (2, 1), (0, 1, 1), (0, 0, 4),
    (0, 0, 0, 0), (5, 0), (0, 3, 0), (1, 3), (0, 0, 5), (0, 0, 6), (6, 0), (2, 0, 0), (1, 0, 1), (0, 1, 2),
    (0, 4, 0), (1, 4), (3, 1), (2, 2), (0, 0, 7), (7, 0), (0, 2, 1), (0, 0, 8), (0, 1, 3), (0, 5, 0),
    (1, 5), (0, 0, 9), (1, 1, 0), (0, 0, 0, 1), (0, 0, 1, 0), (4, 1), (2, 3),
)

#: Every preset by its published name (prefixed with its source), read-only.
TREE_PRESETS: Mapping[str, tuple[Path, ...]] = MappingProxyType(
    {
        "eagle_mc_sim_7b_63": EAGLE_MC_SIM_7B_63,
        "medusa_mc_sim_7b_63": MEDUSA_MC_SIM_7B_63,
        "medusa_vicuna_7b_stage2": MEDUSA_VICUNA_7B_STAGE2,
        "medusa_vicuna_7b_stage1": MEDUSA_VICUNA_7B_STAGE1,
        "medusa_vicuna_7b_stage1_ablation": MEDUSA_VICUNA_7B_STAGE1_ABLATION,
        "medusa_vicuna_13b_stage2": MEDUSA_VICUNA_13B_STAGE2,
        "medusa_vicuna_13b_stage1": MEDUSA_VICUNA_13B_STAGE1,
        "medusa_vicuna_33b_stage2": MEDUSA_VICUNA_33B_STAGE2,
        "medusa_vicuna_33b_stage1": MEDUSA_VICUNA_33B_STAGE1,
        "medusa_zephyr_stage2": MEDUSA_ZEPHYR_STAGE2,
    }
)
