"""The drafter contract: a stateful block whose state goes in and comes out explicitly.

A drafter is any object with the attributes and three methods of :class:`Drafter`. ``generate()`` (through
:func:`specdec.step.step`) calls ``start`` once after the prompt's target pass, then per step ``propose``
(before the target verifies) and ``update`` (after it; also after a plain step, K = 0, which proposes nothing).
Drafters never touch the target model; what they need from it arrives as :class:`Feedback`.

The contracts are NamedTuples; build them by keyword (``Feedback(tokens=..., next_tokens=..., ...)``), so that a
new field never shifts the meaning of a positional argument.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from ..sampling import RandomSource
from ..types import Draft, SamplingParams

__all__ = ["Feedback", "ProposeRequest", "Drafter"]


class Feedback(NamedTuple):
    """Committed tokens the target has just run, and what it computed for them.

    After the prompt's pass these are the prompt tokens (left padding marked invalid); after a verification
    step they are the root and the accepted drafts of each row (left-aligned, the rest invalid).

    Attributes:
        tokens: Shape ``[B, M]`` int64, the committed tokens the target just processed.
        next_tokens: Shape ``[B, M]`` int64, the token that follows each entry in the sequence (``tokens``
            shifted left by one; the last valid entry of a row is followed by the new root). Invalid entries
            of ``tokens`` and ``next_tokens`` hold some valid id (never ``-1``).
        positions: Shape ``[B, M]`` int64, position ids of ``tokens`` (0 = first real prompt token).
        valid: Shape ``[B, M]`` bool, which entries are real.
        features: one tensor of shape ``[B, M, H]`` per layer in the drafter's ``feature_layers``: the
            target's hidden states at these tokens (HF ``hidden_states`` index: ``i`` is the input of decoder
            layer ``i``; ``num_hidden_layers`` is the output after the final norm).
        roots: Shape ``[B]`` int64, the new root (last committed token, not yet run by the target).
        accepted_nodes: Shape ``[B, M]`` int64 or ``None``: for each entry, its node index in the tree the
            drafter last proposed (0 = that step's root, ``-1`` where invalid); ``None`` after the prompt.
            Lets a drafter keep the cache entries it computed for accepted nodes.
    """

    tokens: torch.Tensor
    next_tokens: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    features: tuple[torch.Tensor, ...]
    roots: torch.Tensor
    accepted_nodes: torch.Tensor | None = None


class ProposeRequest(NamedTuple):
    """What ``generate()`` asks of a drafter for one step.

    Attributes:
        roots: Shape ``[B]`` int64, the root token of each row (node 0 of the tree).
        root_positions: Shape ``[B]`` int64, the position id of the root.
        num_drafts: ``K`` from the schedule: the chain length, or for tree drafters the depth bound. A draft
            must never be deeper than ``K`` (the verifiers rely on it). ``0`` never reaches a drafter (the step
            is plain decoding).
        sampling: the sampling parameters of the run (drafters that sample apply them to their own logits).
        source: the run's randomness (a :class:`~specdec.sampling.RandomSource`; ``None`` when greedy), the
            same source the verifier draws from, so pre-drawn noise can drive a whole step. Drafters never use
            the global RNG.
        active: Shape ``[B]`` bool, rows still generating (a drafter may skip work for finished rows).
        vocab_size: ``V``, the target's vocabulary (the width of its logits): draft token ids must lie in
            ``[0, V)`` and ``draft_probs`` have ``V`` columns. A draft model whose embedding is padded past the
            target's masks its extra rows out. ``None``: not given (the drafter's own vocabulary is the target's).
    """

    roots: torch.Tensor
    root_positions: torch.Tensor
    num_drafts: int
    sampling: SamplingParams
    source: RandomSource | None
    active: torch.Tensor
    vocab_size: int | None = None


@runtime_checkable
class Drafter(Protocol):
    """A draft generator.

    Attributes:
        max_num_drafts: the largest ``K`` this drafter accepts (a schedule asking for more is refused).
        feature_layers: target hidden-state layers the drafter needs in :class:`Feedback` (empty for none).

    A drafter may also have ``vocab_size`` (the rows of its output vocabulary), which ``generate()`` checks
    against the target's, and its state may have ``num_forwards`` (forwards of its network so far), which
    :class:`~specdec.stats.GenerationStats` reports.
    """

    max_num_drafts: int
    feature_layers: tuple[int, ...]

    def start(self, feedback: Feedback) -> Any:
        """Build the drafter's state from the prompt's target pass."""

    def propose(self, state: Any, request: ProposeRequest) -> tuple[Draft, Any]:
        """Draft tokens for each row; returns the draft and the new state."""

    def update(self, state: Any, feedback: Feedback) -> Any:
        """Absorb the verification outcome (committed tokens and their target features)."""
