"""Confidence-gated verification: each row verifies only as deep as its drafter is confident (DSpark).

A parallel drafter with a *confidence head* (DSpark) predicts, for each level ``d`` of its block,

.. math:: c_d \\approx P(\\text{draft } d \\text{ accepted} \\mid \\text{drafts } 1..d-1 \\text{ accepted}),

so the chance that the first ``d`` drafts all survive is :math:`a_d = \\prod_{i \\le d} c_i` (non-increasing in
``d``). A *gate* turns ``c`` into a verify length per row, and :func:`truncate_draft` cuts each row's tree to it:

- :class:`ConfidenceGate`: keep level ``d`` while :math:`a_d \\ge` ``threshold`` (at least ``min_depth``, at most
  ``max_depth`` levels). Rows of one batch get their own lengths.
- :class:`CostAwareGate`: the length that maximises expected emitted tokens per modelled step cost,
  :math:`(1 + \\sum_{d \\le L} a_d) / (1 + \\gamma L)`.

Why it is lossless: the gate changes only *how much* is verified. Truncation removes draft nodes and never
changes a surviving node's token, so a draft that was a deterministic function of the head's outputs stays one
(``DraftScheme.DETERMINISTIC``), and the target-only tree verifier, exact for every deterministic draft at any
temperature, stays exact. A row cut to length ``L`` simply emits at most ``L + 1`` tokens that step.

Why it pays: every verified node costs target work (a column of the verification forward, KV writes; at batch 1
with ``trim=True`` the columns no row needs are dropped), and deep drafts that are unlikely to survive rarely pay
for it. In a batch the forward is as wide as the widest row, so the saving there is in the cheaper masks and
verification only, unless every row is cut.

References:
    DSpark, arXiv 2607.05147 (confidence head, adaptive verification; vLLM ``enable_adaptive_verification``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .types import Draft

__all__ = ["ConfidenceGate", "CostAwareGate", "truncate_draft", "truncate_draft_ref", "accept_prefix_probs"]


def _check_confidence(confidence: torch.Tensor) -> None:
    if confidence.dim() != 2:
        raise ValueError(f"confidence must have shape [B, D] (one value per row and level), got "
                         f"{tuple(confidence.shape)}")
    if not confidence.is_floating_point():
        raise TypeError(f"confidence must be a float tensor of probabilities in [0, 1], got {confidence.dtype}")


def _check_depths(min_depth: int, max_depth: int | None) -> None:
    if min_depth < 0:
        raise ValueError(f"min_depth must be >= 0 (0 lets a row verify nothing), got {min_depth}")
    if max_depth is not None and max_depth < max(min_depth, 1):
        raise ValueError(f"max_depth ({max_depth}) must be >= max(min_depth, 1) = {max(min_depth, 1)}; raise it or "
                         f"pass max_depth=None")


def accept_prefix_probs(confidence: torch.Tensor) -> torch.Tensor:
    """Predicted probability that the first ``d`` drafts are all accepted.

    .. math:: a_d = \\prod_{i \\le d} \\mathrm{clamp}(c_i, 0, 1)

    Args:
        confidence: per-level conditional acceptance probabilities.
            Shape: ``[B, D]`` float.

    Returns:
        ``a``. Shape: ``[B, D]`` (float32 or wider), non-increasing along ``D``.
    """
    _check_confidence(confidence)
    return confidence.float().clamp(0.0, 1.0).cumprod(dim=1)


@dataclass(frozen=True)
class ConfidenceGate:
    """Verify length per row: the deepest level whose predicted all-accepted probability reaches a threshold.

    .. math:: L_b = \\mathrm{clip}\\big(\\#\\{d : \\textstyle\\prod_{i \\le d} c_{b,i} \\ge \\tau\\},\\;
              m, \\; \\min(M, D)\\big)

    with threshold ``tau``, ``m = min_depth`` and ``M = max_depth`` (``None``: ``D``). Because the product is
    non-increasing, the count is exactly "keep level ``d`` while the product stays at or above ``tau``".

    Attributes:
        threshold: ``tau`` in ``[0, 1]``; 0 verifies everything, 1 only levels the head is certain of.
        min_depth: levels always kept (``0`` allows a row to verify nothing: a plain decoding step for it).
        max_depth: cap on the length, or ``None``.
        trim: let :func:`truncate_draft` drop trailing columns absent in every row (one host sync per step;
            saves target work when every row is cut, e.g. at batch 1; changes ``N`` from step to step, so leave
            it off under CUDA graphs / static shapes).

    Example:
        >>> ConfidenceGate(0.5)(torch.tensor([[0.9, 0.8, 0.6], [0.4, 0.9, 0.9]])).tolist()
        [2, 1]

    References:
        DSpark arXiv 2607.05147 (confidence-based verification budget).
    """

    threshold: float = 0.5
    min_depth: int = 1
    max_depth: int | None = None
    trim: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1] (a probability), got {self.threshold}")
        _check_depths(self.min_depth, self.max_depth)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Verify length of each row.

        Args:
            confidence: per-level conditional acceptance probabilities (values outside ``[0, 1]`` are clamped).
                Shape: ``[B, D]``.

        Returns:
            Shape ``[B]`` int64, each in ``[min(min_depth, D), min(max_depth, D)]``. No host sync.
        """
        D = confidence.shape[-1]
        lengths = (accept_prefix_probs(confidence) >= self.threshold).sum(1)
        upper = D if self.max_depth is None else min(self.max_depth, D)
        return lengths.clamp(min(self.min_depth, upper), upper)


@dataclass(frozen=True)
class CostAwareGate:
    """Verify length per row that maximises expected emitted tokens per modelled step cost.

    .. math:: L_b = \\arg\\max_{m \\le L \\le M}
              \\frac{1 + \\sum_{d \\le L} a_{b,d}}{1 + \\gamma L}, \\qquad a_{b,d} = \\prod_{i \\le d} c_{b,i}

    The numerator is the expected tokens a step emits when ``L`` chain levels are verified (accepted drafts plus
    the next token); the denominator models the step's cost in units of one plain target forward, each verified
    level adding ``gamma`` (measure it: ``gamma`` = (forward time with ``K`` extra tokens / forward time - 1) /
    ``K``; close to 0 for an overhead-bound target, where verifying everything is right). Ties go to the shorter
    length. For trees, ``gamma`` is per level of the tree (the level's nodes together).

    Attributes:
        gamma: relative cost of one verified level (>= 0).
        min_depth: levels always kept.
        max_depth: cap on the length, or ``None``.
        trim: as in :class:`ConfidenceGate`.

    Example:
        >>> CostAwareGate(0.5)(torch.tensor([[0.9, 0.9, 0.2], [0.3, 0.5, 0.5]])).tolist()
        [2, 1]

    References:
        DSpark arXiv 2607.05147 (confidence head); the expected-length model as in Leviathan et al.,
        arXiv 2211.17192 (Sec. 3.4, choosing gamma by expected walltime improvement).
    """

    gamma: float = 0.1
    min_depth: int = 1
    max_depth: int | None = None
    trim: bool = False

    def __post_init__(self) -> None:
        if not self.gamma >= 0:
            raise ValueError(f"gamma must be >= 0 (the relative cost of one verified level), got {self.gamma}")
        _check_depths(self.min_depth, self.max_depth)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Verify length of each row.

        Args:
            confidence: Shape ``[B, D]``.

        Returns:
            Shape ``[B]`` int64. No host sync.
        """
        _check_confidence(confidence)
        B, D = confidence.shape
        a = accept_prefix_probs(confidence)
        L = torch.arange(D + 1, device=confidence.device)
        gain = torch.cat([a.new_ones(B, 1), 1 + a.cumsum(1)], 1) / (1 + self.gamma * L)      # [B, D + 1]
        upper = D if self.max_depth is None else min(self.max_depth, D)
        allowed = (L >= min(self.min_depth, upper)) & (L <= upper)
        gain = gain.masked_fill(~allowed, float("-inf"))
        # argmax returns the first maximum: ties go to the shorter length
        return gain.argmax(1)


def _check_lengths(draft: Draft, lengths: torch.Tensor) -> None:
    if tuple(lengths.shape) != (draft.parents.shape[0],):
        raise ValueError(f"lengths must have shape [B] = [{draft.parents.shape[0]}] (one verify length per row), got "
                         f"{tuple(lengths.shape)}")


def truncate_draft(draft: Draft, lengths: torch.Tensor, *, trim: bool = False) -> Draft:
    """Cut each row's draft to its verify length: nodes deeper than the row's length become absent.

    .. math:: \\text{present}'_{b,i} = \\text{present}_{b,i} \\wedge \\text{depth}_{b,i} \\le L_b

    Absent nodes get parent ``-1`` and depth ``0`` (the :class:`~specdec.types.Draft` padding convention); tokens
    and ``draft_probs`` are untouched. Every descendant of a cut node is deeper, hence cut too, so the result is a
    valid draft. A deterministic draft stays deterministic (see the module docstring: lossless).

    Args:
        draft: any draft.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        lengths: the verify length of each row (``>= draft.max_depth`` leaves a row as it is; 0 keeps the root).
            Shape: ``[B]`` int64.
        trim: also drop the trailing columns absent in every row. This reads how many columns remain, **one
            host sync**; it saves target work when every row is cut (always at batch 1); without it the shapes
            stay static (CUDA graphs).

    Returns:
        The truncated :class:`~specdec.types.Draft` (``N`` columns, or fewer with ``trim``).

    Example:
        >>> from specdec.trees import LevelTree
        >>> d = LevelTree.chain(3).draft(torch.randn(2, 3, 9))
        >>> truncate_draft(d, torch.tensor([3, 1])).parents.tolist()
        [[-1, 0, 1, 2], [-1, 0, -1, -1]]

    References:
        DSpark arXiv 2607.05147 (adaptive verification).
    """
    _check_lengths(draft, lengths)
    keep = draft.depths <= lengths.to(draft.depths.device)[:, None]                        # [B, N + 1]
    parents = torch.where(keep, draft.parents, -1)
    depths = torch.where(keep, draft.depths, 0)
    out = draft._replace(parents=parents, depths=depths)
    if not trim:
        return out
    present = parents[:, 1:] >= 0                                                          # [B, N]
    column = torch.arange(1, present.shape[1] + 1, device=present.device)
    num_kept = int(torch.where(present, column, 0).amax()) if present.numel() else 0       # host sync (documented)
    return _keep_columns(out, num_kept)


def _keep_columns(draft: Draft, num_nodes: int) -> Draft:
    return draft._replace(tokens=draft.tokens[:, :num_nodes], parents=draft.parents[:, :num_nodes + 1],
                          depths=draft.depths[:, :num_nodes + 1],
                          draft_probs=None if draft.draft_probs is None else draft.draft_probs[:, :num_nodes])


def truncate_draft_ref(draft: Draft, lengths: torch.Tensor, *, trim: bool = False) -> Draft:
    """Reference twin of :func:`truncate_draft`: a per-row, per-node loop that walks each node up to the root.

    A node survives iff it is present and every node on its path to the root is present, and its path has at
    most ``lengths[b]`` edges.

    Args:
        draft: Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        lengths: Shape ``[B]`` int64.
        trim: drop trailing columns absent in every row.

    Returns:
        The truncated :class:`~specdec.types.Draft`.
    """
    _check_lengths(draft, lengths)
    parents, depths = draft.parents.clone(), draft.depths.clone()
    P = draft.parents.tolist()
    B, N1 = draft.parents.shape
    last = 0
    for b in range(B):
        for i in range(1, N1):
            steps, node = 0, i
            while node > 0:
                node = P[b][node]
                steps += 1
            if node != 0 or steps > int(lengths[b]):   # absent (walks to -1) or too deep
                parents[b, i], depths[b, i] = -1, 0
            else:
                last = max(last, i)
    out = draft._replace(parents=parents, depths=depths)
    return _keep_columns(out, last) if trim else out
