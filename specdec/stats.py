"""Statistics of one ``generate()`` call: :class:`GenerationStats` and the small recorder that builds it.

Rows per drafted depth stay on the device (added without a host sync each step, read once at the end); everything
else, accepted depths included, is counted from the host copies a step already made.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import torch

from .types import Draft, VerifyResult

__all__ = ["GenerationStats", "StatsRecorder", "PhaseClock", "synchronize"]


class GenerationStats(NamedTuple):
    """Measured statistics of one ``generate()`` call.

    Attributes:
        num_new_tokens: tokens emitted, summed over rows (after EOS / stop / budget truncation).
        num_target_forwards: target forwards including the prompt's (prefill) pass.
        num_steps: decoding steps (verification forwards) = ``num_target_forwards - 1``.
        num_draft_forwards: forwards of the drafter's network (0 for model-free drafters).
        tau: mean tokens emitted per verification forward and active row, next token included (the
            "mean acceptance length" of the EAGLE and Medusa tables).
        acceptance_per_depth: for d = 1..D, the fraction of (row, step) pairs with a draft at depth d in
            which a depth-d draft was accepted.
        num_accepted_per_step: per step, the accepted drafts of each active row (lists of ints).
        wall_time: seconds from the start of the prefill to the end of the loop (device synchronised).
        prefill_time: seconds of the prompt's pass (synchronised).
        depth_tries: per depth d, (row, step) pairs that drafted depth d.
        depth_hits: per depth d, (row, step) pairs that accepted a depth-d draft.
        phase_times: with ``profile=True``, synchronised seconds spent per phase of the step
            (``draft``, ``target``, ``verify``, ``commit``, ``update``); else ``None``.
    """

    num_new_tokens: int
    num_target_forwards: int
    num_steps: int
    num_draft_forwards: int
    tau: float
    acceptance_per_depth: tuple[float, ...]
    num_accepted_per_step: list
    wall_time: float
    prefill_time: float
    depth_tries: tuple[int, ...] = ()
    depth_hits: tuple[int, ...] = ()
    phase_times: dict | None = None

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of wall time."""
        return self.num_new_tokens / self.wall_time if self.wall_time > 0 else float("nan")


def synchronize(device) -> None:
    """Wait for the device's queued work (CUDA only; a no-op elsewhere), for honest wall-clock times."""
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseClock:
    """Synchronised per-phase timer of the step: call it with a phase name at the end of each phase.

    Args:
        device: the device to synchronise before each reading (adds host syncs: for measurement only).

    Attributes:
        totals: seconds per phase name, summed over steps.
    """

    def __init__(self, device) -> None:
        self.device = device
        self.totals: dict[str, float] = {}
        self._t = 0.0

    def start(self) -> None:
        """Begin a step."""
        synchronize(self.device)
        self._t = time.perf_counter()

    def __call__(self, phase: str) -> None:
        """End ``phase``: add the time since the previous reading."""
        synchronize(self.device)
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + now - self._t
        self._t = now


class StatsRecorder:
    """Builds :class:`GenerationStats` step by step.

    Args:
        max_depth: the deepest draft any step may verify (the drafter's ``max_num_drafts``; 0 without drafter).
        device: where the per-depth counters live.
        profile: time the phases of every step (synchronising between them).
    """

    def __init__(self, max_depth: int, device, *, profile: bool = False) -> None:
        self.device = device
        self.clock = PhaseClock(device) if profile else None
        self.max_depth = max_depth
        # Active rows per drafted depth 0..D (device); depth d's tries are the rows at depths >= d.
        self.drafted = torch.zeros(max_depth + 1, dtype=torch.long, device=device)
        self.hits = [0] * max_depth  # per depth d, active rows that accepted a depth-d draft (host)
        self._late = None  # a late tree step's (emitted, active, drafted), counted at the next record()
        self._drafts: list = []  # (depths, parents, active mask) of steps not yet counted (batched, see _flush)
        self.accepted: list[list[int]] = []
        self.emitted = self.row_steps = 0
        self.t0 = self.prefill_time = 0.0

    def start(self) -> None:
        """The call begins (before the prefill)."""
        synchronize(self.device)
        self.t0 = time.perf_counter()

    def prefilled(self) -> None:
        """The prompt's pass is done."""
        synchronize(self.device)
        self.prefill_time = time.perf_counter() - self.t0

    def record(self, emitted: list[list[int]], active: list[bool], draft: Draft | None,
               result: VerifyResult | None, active_mask: torch.Tensor | None) -> None:
        """Count one step.

        Args:
            emitted: per row, the tokens the step emitted (before the rows' stopping rules), or
                :class:`~specdec.step.LateTokens` (only their ``lengths`` are read; a tree step's are counted at
                the next call, when the next step is queued).
            active: per row, whether it was active during the step.
            draft: the verified draft (``None`` for a plain step).
            result: the verifier's result (``None`` for a plain step).
            active_mask: Shape ``[B]`` bool, ``active`` on the device (for the per-depth counters).
        """
        self._count_late()
        drafted = draft is not None and draft.num_nodes and self.max_depth
        if drafted:
            # Counted on the device, many steps at once (no host sync, no launches per step); read at the end.
            self._drafts.append((draft.depths, draft.parents, active_mask))
            if len(self._drafts) >= 64:
                self._flush()
        if hasattr(emitted, "wait") and emitted.lengths is None:  # a late tree step's: counted at the next step
            self._late = (emitted, list(active), bool(drafted))
            return
        self._count(emitted, active, bool(drafted))

    def _count(self, emitted, active: list[bool], drafted: bool) -> None:
        lengths = getattr(emitted, "lengths", None)  # LateTokens: known without reading the tokens
        counts = [n for n, on in zip(lengths if lengths is not None else map(len, emitted), active) if on]
        self.accepted.append([c - 1 for c in counts])
        self.emitted += sum(counts)
        self.row_steps += len(counts)
        if drafted:
            # An active row emitted its accepted drafts and one more token (result.num_accepted + 1 of them).
            for count in counts:
                for d in range(min(count - 1, self.max_depth)):
                    self.hits[d] += 1

    def _count_late(self) -> None:
        """Count the late tree step held back, if any (its tokens are read now: the next step is queued)."""
        late, self._late = self._late, None
        if late is not None:
            emitted, active, drafted = late
            emitted.wait()
            self._count(emitted, active, drafted)

    def _flush(self) -> None:
        """Add the held steps' drafted depths to ``drafted`` (active rows per deepest drafted depth), one batch of
        launches per draft shape."""
        groups: dict = {}
        for depths, parents, mask in self._drafts:
            groups.setdefault(tuple(depths.shape), []).append((depths, parents, mask))
        self._drafts = []
        for entries in groups.values():
            depths = torch.stack([d for d, _, _ in entries])  # [S, B, N]
            parents = torch.stack([p for _, p, _ in entries])
            weights = torch.stack([torch.ones(d.shape[0], dtype=torch.long, device=d.device) if m is None
                                   else m.long() for d, _, m in entries])  # [S, B]
            deepest = depths.masked_fill(parents < 0, 0).amax(2).clamp_(max=self.max_depth)  # [S, B]
            self.drafted.index_add_(0, deepest.flatten(), weights.flatten())

    def finish(self, num_new_tokens: int, drafter_state) -> GenerationStats:
        """The call ends: synchronise, read the counters (the one sync they need) and build the stats."""
        self._count_late()
        self._flush()
        synchronize(self.device)
        wall = time.perf_counter() - self.t0
        drafted = self.drafted.tolist()
        tries = [sum(drafted[d:]) for d in range(1, self.max_depth + 1)]
        hits = list(self.hits)
        steps = len(self.accepted)
        return GenerationStats(
            num_new_tokens=num_new_tokens,
            num_target_forwards=steps + 1,
            num_steps=steps,
            num_draft_forwards=int(getattr(drafter_state, "num_forwards", 0) or 0),
            tau=self.emitted / self.row_steps if self.row_steps else float("nan"),
            acceptance_per_depth=tuple(h / t for h, t in zip(hits, tries) if t),
            num_accepted_per_step=self.accepted,
            wall_time=wall,
            prefill_time=self.prefill_time,
            depth_tries=tuple(tries),
            depth_hits=tuple(hits),
            phase_times=dict(self.clock.totals) if self.clock is not None else None,
        )
