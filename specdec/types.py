"""Typed contracts passed between the blocks of one decoding step.

Shape vocabulary (used in every docstring of the package):

- ``B`` batch rows, ``N`` draft nodes of a tree (the root is node 0, so a tree has ``N + 1`` nodes),
- ``K`` drafts of a chain, ``D`` tree depth (levels 1..D), ``V`` vocabulary, ``T`` tokens, ``H`` hidden size,
- ``L`` KV-cache slots.

Glossary (see ``docs/glossary.md``): *root* is the last committed token (node 0); *draft tokens* are the
proposed nodes 1..N, stored breadth-first with parents before children and siblings in rank order;
*accepted* drafts survive verification; the *next token* is either the *bonus* token (sampled from the target
after the last accepted node when that node has no accepted child to try) or the *recovered* token (sampled
from the residual after a rejection). *tau* is emitted tokens per target forward, next token included.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import torch

__all__ = ["SamplingParams", "DraftScheme", "Draft", "VerifyResult"]


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn from a distribution; applied identically to target and draft.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_k: keep the ``top_k`` most likely tokens (0 disables).
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p`` (1.0 disables).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables top-k), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1] (1.0 disables top-p), got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0


class DraftScheme(str, Enum):
    """How a drafter chose its tokens; each lossless verifier is exact for exactly one scheme.

    - ``DETERMINISTIC``: tokens are a deterministic function of the draft distribution (argmax, top-k
      children, n-gram lookup). Verified target-only (recursive rejection with one-hot proposals).
    - ``IID``: each node's children were sampled independently from the same ``draft_probs`` (SpecInfer).
      A chain drawn by sampling is this scheme with one child per node.
    - ``WITHOUT_REPLACEMENT``: each node's children were sampled one after another from ``draft_probs``
      with earlier siblings removed and the rest renormalised (recursive rejection sampling, RSD).
    """

    DETERMINISTIC = "deterministic"
    IID = "iid"
    WITHOUT_REPLACEMENT = "without_replacement"


class Draft(NamedTuple):
    """Draft tokens laid out as a tree, per batch row (a chain is a tree with one child per node).

    Node 0 is the root (the last committed token, not stored in ``tokens``); node ``i >= 1`` holds
    ``tokens[:, i - 1]``. Nodes are breadth-first: a parent's index is smaller than its children's, and
    siblings appear in the order they were proposed (rank 0 first). A node whose ``parents`` entry is ``-1``
    (other than the root) is *absent*: padding for rows that draft fewer nodes, never verified.

    Attributes:
        tokens: Shape ``[B, N]`` int64, the draft token ids (any value at absent nodes).
        parents: Shape ``[B, N + 1]`` int64, parent node index of each node; ``-1`` for the root and for
            absent nodes.
        depths: Shape ``[B, N + 1]`` int64, level of each node (root 0); absent nodes 0.
        draft_probs: Shape ``[B, N, V]`` float or ``None``. For sampled schemes, row ``i - 1`` is the full
            (processed) draft distribution that node ``i`` and its siblings were drawn from, i.e. the draft's
            distribution at the parent's position, *before* any sibling was removed. ``None`` for
            ``DETERMINISTIC`` drafts.
        scheme: how the tokens were chosen (picks the verifier that is exact for them).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: torch.Tensor | None
    scheme: DraftScheme

    @property
    def num_nodes(self) -> int:
        """``N``: draft nodes per row, absent ones included (the root is not counted)."""
        return self.tokens.shape[1]

    @property
    def max_depth(self) -> int:
        """``D``: the deepest level any row drafts (0 for an empty draft)."""
        return int(self.depths.max()) if self.depths.numel() else 0


class VerifyResult(NamedTuple):
    """Outcome of verifying one :class:`Draft` against the target, per row.

    Attributes:
        accepted_nodes: Shape ``[B, D + 1]`` int64, node indices of the accepted path, root first (column 0
            is always 0), padded with ``-1`` after ``num_accepted + 1`` entries.
        num_accepted: Shape ``[B]`` int64, accepted draft tokens per row (``0..D``).
        next_tokens: Shape ``[B]`` int64, the token emitted after the accepted drafts: the bonus token when
            the last accepted node had no child left to try, else the recovered token.

    A row emits ``num_accepted + 1`` tokens: the draft tokens at ``accepted_nodes[1 : num_accepted + 1]``
    followed by ``next_tokens``.
    """

    accepted_nodes: torch.Tensor
    num_accepted: torch.Tensor
    next_tokens: torch.Tensor
