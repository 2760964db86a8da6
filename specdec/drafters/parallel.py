"""A drafter for *parallel heads*: heads that give every level's distribution in one forward.

Medusa heads read the target's feature of the last committed token and predict the tokens 1, 2, ..., D positions
after the root, all at once. P-EAGLE (mask tokens plus a learned shared hidden state) and DFlash-style block
drafters (a block of mask slots with the target's features as context) have the same shape: one forward, ``D``
distributions. :class:`ParallelDrafter` drives any such head with a level-wise tree policy
(:class:`~specdec.trees.LevelTree`): one head call per step, one ``topk``, one gather.

The head protocol (:class:`ParallelHead`)::

    head.feature_layers                      # target hidden-state layers it reads (HF hidden_states indices)
    head.num_levels                          # D: levels one call predicts
    head.vocab_size                          # V: the target vocabulary
    head.level_logits(state, request)        # -> [B, D, V]
    # optional: everything a step drafts from (logits, DSpark's confidence and Markov transition)
    head.level_outputs(state, request)       # -> LevelOutput; preferred over level_logits when present
    # optional, for heads that keep context (a KV cache of committed tokens, ...):
    head.start(feedback) -> state            # after the prompt's target pass
    head.update(state, feedback) -> state    # after each verification step

**CUDA graphs.** :class:`ParallelDrafter` is a :class:`~specdec.graphs.GraphableDrafter`: ``propose`` is
``run_step(draft_step(...))`` and ``update`` is ``run_step(absorb_step(...))``, so
:func:`specdec.graphs.cuda_graphed` captures a step once per shape and replays it. A step's captured function is
the head's tensor work, then the tree policy (:meth:`~specdec.trees.LevelTree.draft`, with DSpark's transition)
and the gate (:func:`~specdec.gating.truncate_draft` with ``trim=False``): no host sync. A stateless head's step is
built here (its inputs: the features at the last committed token and the request's ``roots``, ``root_positions``
and ``active``; a replay sees the first capture's ``sampling`` and ``source``, which a deterministic head
ignores). A stateful head makes its steps graphable with three optional hooks (P-EAGLE and DFlash / DSpark
implement them)::

    head.start(feedback, *, static=False, buffers=None) -> state   # static: buffers that stay put, with headroom
    head.draft_step(state, request) -> Step     # fn(*inputs) -> (LevelOutput, carry); finish(carry) -> state
    head.absorb_step(state, feedback) -> Step   # fn(*inputs) -> carry;                finish(carry) -> state

``carry`` is whatever tensors the successor state needs from the device (``None`` if none); ``finish`` does the
host-side bookkeeping (a host-side bound of the row lengths, re-tightened every few updates from a non-blocking
copy: :func:`specdec.graphs.mark_bound`). A stateful
head without the hooks runs eagerly under the wrapper (its steps have ``key=None``); so does a gate with
``trim=True`` (it reads the kept width: a host sync).

A head without ``start`` / ``update`` is stateless: its state is the target's features at the *last committed
token* of each row (:func:`last_committed_features`), the token whose target logits gave the root. That is what
Medusa reads: head ``k`` at that feature predicts the token ``k + 2`` positions after it, i.e. tree level
``k + 1`` (the root is level 0).

A :class:`LevelOutput` may carry a ``transition`` (DSpark's low-rank Markov head: a node's children are ranked by
its level's logits plus a bias from the node's own token) and a ``confidence`` (DSpark's confidence head), which a
``gate`` (:class:`specdec.gating.ConfidenceGate`) turns into a verify length per row.

The drafts are a deterministic function of the features (``DraftScheme.DETERMINISTIC``), so ``generate()``
verifies them with the target-only tree verifier, which is exact at any temperature. A gate only cuts nodes
away, so the draft stays deterministic and the verifier stays exact.

References:
    Cai et al., "Medusa", arXiv 2401.10774; parallel drafting: P-EAGLE, arXiv 2602.01469, DFlash,
    arXiv 2602.06036, and DSpark (Markov and confidence heads, confidence-gated verification), arXiv 2607.05147.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from ..gating import truncate_draft
from ..graphs import Step, run_step
from ..trees.level import LevelTree, as_level_policy
from ..types import Draft
from .base import Feedback, ProposeRequest

__all__ = ["LevelOutput", "ParallelHead", "ParallelDrafter", "ParallelState", "last_committed_features"]


class LevelOutput(NamedTuple):
    """What a parallel head gives for one step: every level's logits, and optionally DSpark's extra heads.

    Attributes:
        logits: draft logits of levels ``1..D`` (level ``d`` is index ``d - 1``), over the target vocabulary.
            Shape ``[B, D, V]``.
        confidence: predicted ``P(level d accepted | levels < d accepted)`` in ``[0, 1]``, or ``None``.
            Shape ``[B, D]``. A gate (:class:`specdec.gating.ConfidenceGate`) turns it into verify lengths.
        transition: ``transition(prev_tokens, d) -> bias`` or ``None``: a node at level ``d`` whose parent holds
            token ``x`` has logits ``logits[:, d - 1] + transition(x, d)`` (DSpark's low-rank Markov head). The
            parent of level 1 is the root (``request.roots``). Shape: ``prev_tokens [B, n]`` int64 ->
            ``[B, n, V]``.
        state: the head's state after this call, for a head whose forward changes it (P-EAGLE's one forward
            absorbs the committed entries as it drafts); ``None``: unchanged. Heads keep states immutable and
            return the successor here instead of flipping flags inside the old one.

    References:
        DSpark arXiv 2607.05147 (Markov head, confidence head).
    """

    logits: torch.Tensor
    confidence: torch.Tensor | None = None
    transition: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    state: Any = None


@runtime_checkable
class ParallelHead(Protocol):
    """A head that predicts every tree level's distribution in one call.

    Attributes:
        feature_layers: target hidden-state layers the head reads (HF ``hidden_states`` indices).
        num_levels: ``D``, levels one call predicts.
        vocab_size: ``V``, the target vocabulary.
    """

    feature_layers: tuple[int, ...]
    num_levels: int
    vocab_size: int

    def level_logits(self, state: Any, request: ProposeRequest | None) -> torch.Tensor:
        """Draft logits of levels ``1..D`` for each row, shape ``[B, D, V]``.

        A head may also define ``level_outputs(state, request) -> LevelOutput`` (logits plus DSpark's confidence
        and transition); :class:`ParallelDrafter` calls it instead when present.

        A stateful head (``start`` / ``update``) may also define the step hooks that make it capturable by
        :func:`specdec.graphs.cuda_graphed` (the module docstring): ``start(feedback, *, static=False,
        buffers=None)``; ``draft_step(state, request) -> Step`` whose ``fn(*inputs)`` returns
        ``(LevelOutput, carry)`` and whose ``finish(carry)`` returns the successor state; ``absorb_step(state,
        feedback) -> Step`` whose ``fn`` returns ``carry`` and whose ``finish(carry)`` returns the new state. Each
        ``fn`` has static shapes given its ``key`` and input shapes, no host sync, and writes only its
        ``buffers``; ``update`` / ``level_outputs`` should be ``run_step`` of them (one computation, eager or
        replayed).
        """


class ParallelState(NamedTuple):
    """What a :class:`ParallelDrafter` carries between steps.

    Attributes:
        head_state: the head's state (for stateless heads: :func:`last_committed_features`).
        num_forwards: head calls so far (read by ``generate()``'s statistics).
    """

    head_state: Any
    num_forwards: int


def last_committed_features(feedback: Feedback, previous: tuple[torch.Tensor, ...] | None = None
                            ) -> tuple[torch.Tensor, ...]:
    """The target's features at each row's last valid feedback entry (the last committed token).

    Rows without a valid entry (finished rows after a step) keep ``previous``. No host sync.

    Args:
        feedback: committed tokens and their features.
            Shape: valid ``[B, M]``, each feature ``[B, M, H_i]``.
        previous: the state before this feedback (``None`` after the prompt, where every row has a token).

    Returns:
        One tensor per feature layer. Shape: each ``[B, H_i]``.
    """
    return _last_valid(feedback.valid, tuple(feedback.features), previous)


def _last_valid(valid: torch.Tensor, features: tuple[torch.Tensor, ...], previous: tuple[torch.Tensor, ...] | None
                ) -> tuple[torch.Tensor, ...]:
    """:func:`last_committed_features` on the feedback's ``valid`` and ``features`` alone (a capturable step)."""
    valid = valid.bool()
    B, M = valid.shape
    last = torch.where(valid, torch.arange(M, device=valid.device), -1).amax(1)        # [B]
    out = []
    for i, feature in enumerate(features):
        picked = feature.gather(1, last.clamp(min=0)[:, None, None].expand(B, 1, feature.shape[-1]))[:, 0]
        if previous is not None:
            picked = torch.where((last >= 0)[:, None], picked, previous[i].to(picked.dtype))
        out.append(picked)
    return tuple(out)


class ParallelDrafter:
    """Drafter for parallel heads (Medusa, and P-EAGLE / DFlash-style heads): one head call per step.

    Each step: ``out = head.level_outputs(state, request)`` (a :class:`LevelOutput`; heads with only
    ``level_logits`` give ``LevelOutput(logits)``), then the level-wise tree policy takes rank ``r_d`` of level
    ``d`` for the node with path ``(r_1, ..., r_d)`` (with ``out.transition``: rank ``r_d`` of the level's logits
    biased by the parent node's token), then, with a ``gate``, each row's tree is cut to
    ``gate(out.confidence)`` levels (:func:`specdec.gating.truncate_draft`).

    Args:
        head: a :class:`ParallelHead` (e.g. :class:`~specdec.heads.MedusaHead`) on the target's device.
        tree: a :class:`~specdec.trees.LevelTree`, a compiled tree or tree choices (default: the chain of every
            level's top-1).
        gate: ``None``, or a callable ``confidence [B, D] -> lengths [B]`` such as
            :class:`specdec.gating.ConfidenceGate`; its ``trim`` attribute (default False) is passed to
            :func:`~specdec.gating.truncate_draft`. Needs a head whose ``level_outputs`` gives a ``confidence``.

    Attributes:
        max_num_drafts: the tree's depth (a step's ``K`` prunes it to depth ``K``).
        feature_layers: the head's target layers.
        vocab_size: the head's vocabulary.

    Raises:
        ValueError: the tree is deeper than the head has levels.

    Example:
        >>> drafter = ParallelDrafter(MedusaHead.from_target(model), MEDUSA_MC_SIM_7B_63)  # doctest: +SKIP
        >>> out = specdec.generate(model, ids, drafter=drafter)                             # doctest: +SKIP

    References:
        Medusa arXiv 2401.10774 (one forward of all heads per step; candidates from each head's top-k);
        DSpark arXiv 2607.05147 (Markov transition, confidence-gated verification).
    """

    def __init__(self, head: ParallelHead, tree=None, *, gate: Callable[[torch.Tensor], torch.Tensor] | None = None):
        for attr in ("feature_layers", "num_levels", "vocab_size", "level_logits"):
            if not hasattr(head, attr):
                raise TypeError(f"{type(head).__name__} is not a parallel head: it lacks {attr!r} (see "
                                f"specdec.drafters.parallel.ParallelHead)")
        self.head = head
        self.policy = LevelTree.chain(head.num_levels) if tree is None else as_level_policy(tree)
        if self.policy.max_depth > head.num_levels:
            raise ValueError(f"the tree is {self.policy.max_depth} levels deep but the head predicts "
                             f"{head.num_levels}: prune it (tree.prune({head.num_levels})) or use a head with "
                             f"more levels")
        self.max_num_drafts = self.policy.max_depth
        self.feature_layers = tuple(head.feature_layers)
        self.vocab_size = head.vocab_size
        if gate is not None and not callable(gate):
            raise TypeError(f"gate must be a callable confidence [B, D] -> lengths [B] (e.g. "
                            f"specdec.gating.ConfidenceGate(0.5)), got {type(gate).__name__}")
        self.gate = gate
        self._outputs = callable(getattr(head, "level_outputs", None))
        self._stateful = callable(getattr(head, "start", None)) and callable(getattr(head, "update", None))
        self._steps = self._stateful and all(callable(getattr(head, f, None)) for f in ("draft_step", "absorb_step"))

    @property
    def prefetches_drafts(self) -> bool:
        """Whether :meth:`draft_step` reads of a request only ``num_drafts`` and ``roots``, so that
        :class:`~specdec.graphs.GraphedDrafter` may draft the next step inside :meth:`update`'s graph: heads with the
        step hooks (P-EAGLE, DFlash, DSpark), without a gate that trims (a host sync)."""
        return self._steps and not (self.gate is not None and bool(getattr(self.gate, "trim", False)))

    @property
    def folds_drafts(self) -> bool:
        """Whether :class:`~specdec.graphs.GraphedDrafter` may run the update and the next draft inside the fast
        path's verify step (:meth:`~specdec.graphs.GraphedDrafter.fold_for`): as :attr:`prefetches_drafts`."""
        return self.prefetches_drafts

    def __repr__(self) -> str:
        gate = "" if self.gate is None else f", gate={self.gate!r}"
        return f"ParallelDrafter({type(self.head).__name__}, {self.policy!r}{gate})"

    @torch.no_grad()
    def start(self, feedback: Feedback, *, static: bool = False, buffers: Any = None) -> ParallelState:
        """Build the state from the prompt's target pass.

        Args:
            feedback: the prompt's :class:`~specdec.drafters.Feedback` (left padding invalid).
            static: allocate the head's buffers to stay put (with headroom), for :mod:`specdec.graphs` (heads with
                the step hooks; others ignore it).
            buffers: with ``static``, the ``Step.buffers`` of an earlier run, reused when they fit.

        Returns:
            A :class:`ParallelState`.
        """
        if not self._stateful:
            return ParallelState(last_committed_features(feedback), 0)
        if self._steps:
            return ParallelState(self.head.start(feedback, static=static, buffers=buffers), 0)
        return ParallelState(self.head.start(feedback), 0)

    @torch.no_grad()
    def propose(self, state: ParallelState, request: ProposeRequest) -> tuple[Draft, ParallelState]:
        """Draft the tree (pruned to ``request.num_drafts`` levels) from one head call.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's :class:`~specdec.drafters.ProposeRequest`.

        Returns:
            ``(draft, state)``: a ``DETERMINISTIC`` draft.
        """
        return run_step(self.draft_step(state, request))

    @torch.no_grad()
    def update(self, state: ParallelState, feedback: Feedback) -> ParallelState:
        """Absorb the committed tokens (root + accepted drafts) and their target features.

        Args:
            state: the state returned by :meth:`propose`.
            feedback: the step's :class:`~specdec.drafters.Feedback`.

        Returns:
            The new :class:`ParallelState`.
        """
        return run_step(self.absorb_step(state, feedback))

    # ---- the steps (specdec.graphs captures them) ------------------------------------------------------

    def _head_draft_step(self, state: Any, request: ProposeRequest) -> Step:
        """The head's part of a draft step: ``fn(*inputs) -> (LevelOutput, carry)``, ``finish(carry) -> state``."""
        if self._steps:
            return self.head.draft_step(state, request)
        if self._stateful:  # no hooks: one eager call; the successor state rides in the (uncaptured) output
            def call() -> tuple[LevelOutput, Any]:
                out = self._level_outputs(state, request)
                return out, (state if out.state is None else out.state)

            return Step(fn=call, inputs=(), finish=lambda carry: carry, key=None)

        n = len(state)

        def stateless(*inputs: torch.Tensor) -> tuple[LevelOutput, None]:
            # a replay reuses the first capture's closure: the request's tensors must come in as inputs
            roots, root_positions, active = inputs[n:]
            now = request._replace(roots=roots, root_positions=root_positions, active=active)
            return self._level_outputs(tuple(inputs[:n]), now), None

        inputs = (*state, request.roots, request.root_positions, request.active)
        return Step(fn=stateless, inputs=inputs, finish=lambda _: state, key=("stateless", request.num_drafts))

    def _level_outputs(self, head_state: Any, request: ProposeRequest) -> LevelOutput:
        if self._outputs:
            return self.head.level_outputs(head_state, request)
        return LevelOutput(logits=self.head.level_logits(head_state, request))

    def draft_step(self, state: ParallelState, request: ProposeRequest) -> Step:
        """:meth:`propose` as a :class:`~specdec.graphs.Step`: the head's step, then the tree policy and the gate.

        Args:
            state: from :meth:`start` / :meth:`update`.
            request: the step's request.

        Returns:
            A step whose inputs are the head step's inputs then ``request.roots``, and whose ``finish`` returns
            ``(draft, state)``; its key is ``("propose", depth, <head step's key>)``, or ``None`` where the head's
            step has none or the gate trims (a host sync).
        """
        if request.num_drafts < 1:
            raise ValueError(f"num_drafts must be >= 1 (K = 0 is a plain step and never reaches a drafter), got "
                             f"{request.num_drafts}")
        depth = min(self.max_num_drafts, request.num_drafts)
        head_step = self._head_draft_step(state.head_state, request)
        n = len(head_step.inputs)
        head_fn = head_step.fn

        def draft(*inputs) -> tuple[Draft, Any]:
            out, carry = head_fn(*inputs[:n])
            return self._draft(out, depth, inputs[n]), carry

        def finish(outputs: tuple[Draft, Any]) -> tuple[Draft, ParallelState]:
            draft_, carry = outputs
            return draft_, ParallelState(head_step.finish(carry), state.num_forwards + 1)

        trims = self.gate is not None and bool(getattr(self.gate, "trim", False))
        key = None if head_step.key is None or trims else ("propose", depth, head_step.key)
        return Step(fn=draft, inputs=(*head_step.inputs, request.roots), finish=finish, key=key,
                    buffers=head_step.buffers)

    def _draft(self, out: LevelOutput, depth: int, roots: torch.Tensor) -> Draft:
        """The tree policy and the gate on a head's outputs (no host sync unless the gate trims)."""
        if out.transition is None:
            draft = self.policy.draft(out.logits, depth)
        else:
            draft = self.policy.draft(out.logits, depth, transition=out.transition, roots=roots)
        if self.gate is not None:
            draft = self._gated(draft, out.confidence, depth)
        return draft

    def absorb_step(self, state: ParallelState, feedback: Feedback) -> Step:
        """:meth:`update` as a :class:`~specdec.graphs.Step`.

        Args:
            state: the state returned by :meth:`propose`.
            feedback: the committed entries.

        Returns:
            A step whose ``finish`` returns the new :class:`ParallelState`. Stateless heads: inputs ``(valid,
            features, previous features)``, key ``("update",)``; heads with the hooks: the head's step; other
            stateful heads: an eager step (``key=None``).
        """
        if self._steps:
            head_step = self.head.absorb_step(state.head_state, feedback)
            return head_step._replace(finish=lambda carry: state._replace(head_state=head_step.finish(carry)))
        if self._stateful:
            return Step(fn=lambda: self.head.update(state.head_state, feedback), inputs=(),
                        finish=lambda head_state: state._replace(head_state=head_state), key=None)

        wide = feedback.tokens.shape[1] > self.max_num_drafts + 1  # a prompt: one shape per length, run eagerly
        return Step(fn=_last_valid, inputs=(feedback.valid, tuple(feedback.features), tuple(state.head_state)),
                    finish=lambda features: state._replace(head_state=tuple(features)),
                    key=None if wide else ("update",))

    def _gated(self, draft: Draft, confidence: torch.Tensor | None, depth: int) -> Draft:
        if confidence is None:
            raise ValueError(f"the gate needs a confidence but {type(self.head).__name__} gave none: use a head whose "
                             f"level_outputs returns LevelOutput(confidence=...) (e.g. DSpark's) or drop gate=")
        if confidence.dim() != 2 or confidence.shape[1] < depth:
            raise ValueError(f"confidence must have shape [B, D] with D >= {depth} (the drafted depth), got "
                             f"{tuple(confidence.shape)}")
        lengths = self.gate(confidence[:, :depth])
        return truncate_draft(draft, lengths, trim=bool(getattr(self.gate, "trim", False)))
