"""Dynamic speculative decoding: how many drafts ``K`` to verify at a given active batch size.

Verifying ``K`` drafts per row makes the target run ``B * (K + 1)`` tokens per step. Past the batch size where
the target stops being memory-bound, those extra tokens cost real time and speculation slows decoding down, so
``K`` should shrink as the batch grows (and grow again when a long tail of rows is left). A schedule is a
table from the number of active rows to ``K``; ``K = 0`` means a plain decoding step with no drafter call.

The format is vLLM's ``num_speculative_tokens_per_batch_size``: inclusive ``[start_bs, end_bs, K]`` ranges.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Schedule", "make_schedule"]


@dataclass(frozen=True)
class Schedule:
    """A validated batch-size -> ``K`` table; call it with the active batch size.

    Build it with :func:`make_schedule`, which validates the ranges; the constructor trusts its inputs.

    Attributes:
        ranges: the inclusive ``(start_bs, end_bs, K)`` ranges, as given (a constant schedule is
            ``((1, 1, K),)``).
        max_num_drafts: the drafter's maximum ``K`` the ranges were checked against.
        table: ``table[bs]`` is ``K`` for ``1 <= bs < len(table)`` (index 0 is unused); the table ends at the
            last range's ``start_bs``, and larger batch sizes use its last entry.
    """

    ranges: tuple[tuple[int, int, int], ...]
    max_num_drafts: int
    table: tuple[int, ...] = field(repr=False)

    def __call__(self, active_batch_size: int) -> int:
        """``K`` for a step with ``active_batch_size`` rows still generating (O(1) table lookup).

        Args:
            active_batch_size: rows still generating in this step, ``>= 1``.

        Returns:
            The number of drafts to verify per row; ``0`` means a plain decoding step.
        """
        bs = operator.index(active_batch_size)
        if bs < 1:
            raise ValueError(
                f"active_batch_size must be >= 1, got {bs}; a step with no active rows needs no K "
                "(stop the loop instead)"
            )
        if bs >= len(self.table):
            return self.table[-1]
        return self.table[bs]

    @property
    def max_k(self) -> int:
        """The largest ``K`` any batch size gets (what buffers must be sized for)."""
        return max(k for _, _, k in self.ranges)

    @property
    def is_constant(self) -> bool:
        """True when every batch size gets the same ``K``."""
        return len({k for _, _, k in self.ranges}) == 1


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got the bool {value!r}; write the number itself")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


def make_schedule(
    num_speculative_tokens_per_batch_size: int | Sequence[Sequence[int]],
    max_num_drafts: int,
) -> Schedule:
    """Validate vLLM-style ``[start_bs, end_bs, K]`` ranges (or a constant ``K``) into a :class:`Schedule`.

    A batch size inside a range gets that range's ``K``. A batch size in a gap between ranges, or past the last
    range, gets the ``K`` of the closest range before it (as vLLM does): with
    ``[(1, 16, 3), (32, 128, 2), (256, 256, 0)]``, sizes 17..31 get 3, 129..255 get 2, and 256 and above get 0.

    Unlike vLLM, which silently clamps a ``K`` above the drafter's maximum, a ``K`` above ``max_num_drafts``
    is refused with an error: a schedule that asks for more drafts than the drafter can make is a mistake the
    user should see, not a setting quietly changed.

    Args:
        num_speculative_tokens_per_batch_size: either a list of ``[start_bs, end_bs, K]`` ranges, inclusive at
            both ends, sorted, non-overlapping, the first starting at 1; or a plain int ``K`` for the same
            ``K`` at every batch size. ``K = 0`` turns drafting off for that range.
        max_num_drafts: the largest ``K`` the drafter supports (``Drafter.max_num_drafts``), ``>= 0``.

    Returns:
        The :class:`Schedule`; ``schedule(active_batch_size)`` gives ``K``.

    Example:
        >>> schedule = make_schedule([[1, 64, 3], [65, 128, 1], [129, 512, 0]], max_num_drafts=3)
        >>> schedule(1), schedule(64), schedule(65), schedule(200), schedule(4096)
        (3, 3, 1, 0, 0)

    References:
        vLLM PR #32374, "[V1][Spec Decode] Add Dynamic SD" (``num_speculative_tokens_per_batch_size``),
        https://github.com/vllm-project/vllm/pull/32374
    """
    max_num_drafts = _as_int(max_num_drafts, "max_num_drafts")
    if max_num_drafts < 0:
        raise ValueError(f"max_num_drafts must be >= 0 (the drafter's largest K), got {max_num_drafts}")

    if not isinstance(num_speculative_tokens_per_batch_size, (str, bytes, Sequence)):
        k = _as_int(num_speculative_tokens_per_batch_size, "a constant schedule K")
        entries: list[tuple[int, int, int]] = [(1, 1, k)]
        constant = True
    else:
        if isinstance(num_speculative_tokens_per_batch_size, (str, bytes)):
            raise TypeError(
                "num_speculative_tokens_per_batch_size must be a list of [start_bs, end_bs, K] ranges or an "
                f"int K, got the string {num_speculative_tokens_per_batch_size!r}; parse JSON before passing it"
            )
        if len(num_speculative_tokens_per_batch_size) == 0:
            raise ValueError(
                "num_speculative_tokens_per_batch_size is empty; give at least one [start_bs, end_bs, K] range "
                "starting at 1, e.g. [[1, 64, 3]], or a constant K"
            )
        entries = [_check_entry(i, entry) for i, entry in enumerate(num_speculative_tokens_per_batch_size)]
        constant = False

    for i, (start, end, k) in enumerate(entries):
        label = f"constant K={k}" if constant else f"entry {i} {[start, end, k]}"
        if k < 0:
            raise ValueError(f"{label}: K must be >= 0 (0 turns drafting off), got {k}")
        if k > max_num_drafts:
            raise ValueError(
                f"{label}: K={k} exceeds the drafter's max_num_drafts={max_num_drafts}; lower K to at most "
                f"{max_num_drafts} or use a drafter built for more drafts (specdec refuses rather than clamps, "
                "unlike vLLM, so that the mistake is visible)"
            )
        if i == 0 and start != 1:
            raise ValueError(
                f"{label}: the first range must start at batch size 1, got start_bs={start}; "
                f"write [1, {end}, {k}] or add a range [1, {start - 1}, K] before it"
            )
        if i > 0:
            prev_end = entries[i - 1][1]
            if start <= prev_end:
                raise ValueError(
                    f"{label}: overlaps or precedes the previous range, which ends at {prev_end}; ranges must be "
                    f"sorted and non-overlapping, so start_bs must be > {prev_end}"
                )

    # Dense up to the last range's start; every size from there on gets the last K. A range's K holds until
    # the next range starts, so gaps inherit the previous K (as in vLLM).
    table = [entries[0][2]] * (entries[-1][0] + 1)
    starts_after = [start for start, _, _ in entries[1:]] + [len(table)]
    for (start, _, k), next_start in zip(entries, starts_after):
        table[start:next_start] = [k] * (next_start - start)
    return Schedule(ranges=tuple(entries), max_num_drafts=max_num_drafts, table=tuple(table))


def _check_entry(i: int, entry: object) -> tuple[int, int, int]:
    if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 3:
        raise ValueError(
            f"entry {i} {entry!r}: each entry must be a list of 3 ints [start_bs, end_bs, K], "
            "e.g. [1, 64, 3] (batch sizes 1 to 64 inclusive use K=3)"
        )
    start = _as_int(entry[0], f"entry {i} {list(entry)!r}: start_bs")
    end = _as_int(entry[1], f"entry {i} {list(entry)!r}: end_bs")
    k = _as_int(entry[2], f"entry {i} {list(entry)!r}: K")
    if start < 1:
        raise ValueError(f"entry {i} {[start, end, k]}: start_bs must be >= 1 (batch sizes start at 1), got {start}")
    if end < start:
        raise ValueError(
            f"entry {i} {[start, end, k]}: end_bs={end} is below start_bs={start}; ranges are inclusive "
            f"[start_bs, end_bs] with start_bs <= end_bs, e.g. [{start}, {start}, {k}] for one batch size"
        )
    return start, end, k
