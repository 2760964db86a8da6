"""Row bookkeeping of ``generate()``: what each row has emitted, when it stops, what it streams.

A step hands every row a list of tokens (its accepted drafts, then the next token). :class:`Rows` cuts them at the
rules HF ``generate`` users know: the row's budget (``max_new_tokens``, never exceeded), an EOS token (kept,
then the row stops), a stop string (the row stops right after the token that completes it); it streams what it
keeps and says which rows are still active and how many drafts the next step may verify. Host-side only: it
never touches the device except to hand out the active mask, rebuilt only when a row finishes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["Rows", "stop_index"]


def stop_index(text_of: Callable[[list[int]], str], tokens: list[int], stop_strings: Sequence[str]) -> int | None:
    """Smallest ``t`` such that the decoded ``tokens[:t]`` contains a stop string, or ``None``.

    Math: the predicate "``text_of(tokens[:t])`` contains a stop string" is monotone in ``t``, so ``t`` is found
    by bisection (``O(log n)`` decodes).

    Args:
        text_of: decodes a list of token ids to text (e.g. ``tokenizer.decode``).
        tokens: the row's tokens so far.
        stop_strings: the strings that end a row.

    Returns:
        The number of tokens to keep, or ``None`` when no stop string occurs.

    Example:
        >>> stop_index(lambda t: "".join(map(str, t)), [1, 2, 3, 4], ["23"])
        3
    """
    if not any(s in text_of(tokens) for s in stop_strings):
        return None
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in text_of(tokens[:mid]) for s in stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return lo


class Rows:
    """Per-row tokens and stopping rules of one ``generate()`` call (host-side).

    Args:
        prompt_lengths: real prompt tokens per row (a row's committed length is its prompt length plus its
            emitted tokens minus one: the last emitted token, the root, has not run yet).
        max_new_tokens: new tokens per row, never exceeded.
        eos: token ids after which a row stops (the EOS token is kept).
        stop_strings: strings after whose completing token a row stops (needs ``decode``).
        decode: ``tokens -> text``, for ``stop_strings``.
        streamer: an HF streamer (``put`` / ``end``) that receives each kept token chunk (batch size 1).

    A step may hand its tokens over late (:class:`~specdec.step.LateTokens`, still on their way to the host):
    :meth:`absorb` keeps them aside and reads them at the next call, once the next step is queued on the device,
    so the host's work overlaps the device's. Until then each row counts one token as spent from its budget (a
    plain step's exact count; a tree step's least), and positions are bounded with the most it may hold. A tree
    step's tokens that may reach a row's budget are read at once (so no step runs past a budget). An EOS or a stop
    string inside late tokens is learnt one step late: the next step's tokens of a row that stopped are dropped,
    as for any inactive row, so the kept tokens are the same.

    Attributes:
        tokens: per row, the tokens kept so far.
        active: per row, whether it is still generating (stopped rows and rows whose budget the late token
            spends are not).
    """

    def __init__(self, prompt_lengths: Sequence[int], max_new_tokens: int, *, eos: Sequence[int] = (),
                 stop_strings: Sequence[str] = (), decode: Callable[[list[int]], str] | None = None,
                 streamer=None):
        self.prompt_lengths = list(prompt_lengths)
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(eos)
        self.stop_strings = list(stop_strings)
        self.decode = decode
        self.streamer = streamer
        self.tokens: list[list[int]] = [[] for _ in self.prompt_lengths]
        self._going = [True] * len(self.prompt_lengths)  # not stopped by budget, EOS or stop string
        self._late = None  # a plain step's tokens still on their way to the host
        self._mask: torch.Tensor | None = None
        self._mask_of: list[bool] | None = None

    @property
    def _spent(self) -> int:
        """Tokens each row has spent from its budget but not read yet (at least; the late tokens, if any)."""
        return 1 if self._late is not None else 0

    @property
    def _spent_max(self) -> int:
        """The most tokens a row may have spent but not read yet (what positions are bounded with)."""
        return self._late.max_length if self._late is not None else 0

    @property
    def active(self) -> list[bool]:
        """Per row, whether it still generates: not stopped, with budget left after the late token (if any)."""
        return [on and len(t) + self._spent < self.max_new_tokens for on, t in zip(self._going, self.tokens)]

    @property
    def any_active(self) -> bool:
        """Whether some row still generates."""
        return any(self.active)

    @property
    def num_active(self) -> int:
        """Rows still generating (what a Dynamic SD schedule looks up)."""
        return sum(self.active)

    def active_mask(self, device) -> torch.Tensor:
        """Shape ``[B]`` bool on ``device``: the active rows (rebuilt only when a row has finished)."""
        active = self.active
        if self._mask_of != active:
            self._mask, self._mask_of = torch.tensor(active, device=device), active
        return self._mask

    def absorb(self, emitted: Sequence[Sequence[int]]) -> None:
        """Keep each active row's emitted tokens up to its budget, EOS or stop string; stream them.

        Late tokens (anything with a ``wait()`` method returning the per-row lists, e.g.
        :class:`~specdec.step.LateTokens`) are kept aside and read at the next call (or :meth:`settle`); the
        late tokens held before are read first, so rows always take steps in order.

        Args:
            emitted: per row, the tokens a step emitted (inactive rows' entries are ignored).
        """
        self.settle()
        if hasattr(emitted, "wait"):
            self._late = emitted
            if emitted.lengths is None and any(on and len(t) + emitted.max_length >= self.max_new_tokens
                                               for on, t in zip(self._going, self.tokens)):
                self.settle()  # a row's budget may end inside them: read them now, so no step runs past it
            return
        self._absorb_now(emitted)

    def settle(self) -> None:
        """Read the late tokens, if any (waits for their copy to the host), and keep them."""
        late, self._late = self._late, None
        if late is not None:
            self._absorb_now(late.wait())

    def _absorb_now(self, emitted: Sequence[Sequence[int]]) -> None:
        for row, new in enumerate(emitted):
            if self._going[row]:
                self._keep(row, list(new))

    def _keep(self, row: int, new: list[int]) -> None:
        tokens = self.tokens[row]
        new = new[: self.max_new_tokens - len(tokens)]
        for j, token in enumerate(new):
            if token in self.eos:
                new = new[: j + 1]
                self._going[row] = False
                break
        before = len(tokens)
        tokens.extend(new)
        if self.stop_strings:
            cut = stop_index(self.decode, tokens, self.stop_strings)
            if cut is not None:
                del tokens[cut:]
                new = new[: max(cut - before, 0)]  # the streamer gets what the row keeps, nothing past the stop
                self._going[row] = False
        if len(tokens) >= self.max_new_tokens:
            self._going[row] = False
        if self.streamer is not None and new:
            self.streamer.put(torch.tensor(new))

    def num_drafts(self, k: int, max_positions: int | None, *, budget: bool = True) -> int:
        """``K`` for the next step: ``k`` (the schedule's), bounded so that no active row drafts past its budget
        (unless ``budget=False``) or past the model's last position.

        Math: with ``n_b`` tokens kept (the late token counted) and root position ``L_b = prompt_b + n_b - 1``
        for active row ``b``: ``K <= max_b (max_new_tokens - n_b) - 1`` (the step's next token needs room too)
        and ``L_b + K <= max_positions - 1``.

        Args:
            k: the schedule's ``K``.
            max_positions: the model's ``max_position_embeddings`` (``None``: unbounded).
            budget: bound by the budgets too (``False``: by positions only, the depth a step may *draft* while
                verifying less, so that drafting keeps one shape to the end).

        Returns:
            ``K >= 0`` (0: a plain step).
        """
        live = [b for b, on in enumerate(self.active) if on]
        kept = [len(self.tokens[b]) + self._spent for b in live]
        if budget:
            k = min(k, max(self.max_new_tokens - n for n in kept) - 1)
        if max_positions is not None:
            most = self._spent_max - self._spent
            k = min(k, max_positions - 1 - max(self.prompt_lengths[b] + n + most - 1 for b, n in zip(live, kept)))
        return max(k, 0)

    def room_for(self, k: int) -> bool:
        """Whether every active row has room for a step verifying ``k`` drafts whatever its late tokens hold: at
        least ``k + 1`` tokens of budget left after the most the late tokens may have spent.

        Args:
            k: the step's depth.

        Returns:
            ``True`` when no active row's budget can cut the step's draft.
        """
        most = self._spent_max
        return all(len(self.tokens[b]) + most + k + 1 <= self.max_new_tokens
                   for b, on in enumerate(self.active) if on)

    def finish(self) -> None:
        """Read the late tokens (if any) and tell the streamer the call is over."""
        self.settle()
        if self.streamer is not None:
            self.streamer.end()

    def sequences(self, prompts: torch.Tensor, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts followed by each row's kept tokens, right-padded.

        Args:
            prompts: Shape ``[B, T]``, the (left-padded) prompts.
            pad_token_id: fills each row after its last token.

        Returns:
            ``(sequences [B, T + max_b n_b], num_new_tokens [B])``.
        """
        lengths = [len(t) for t in self.tokens]
        new = torch.full((len(lengths), max(lengths)), pad_token_id, dtype=prompts.dtype)
        for b, tokens in enumerate(self.tokens):
            new[b, : len(tokens)] = torch.tensor(tokens, dtype=prompts.dtype)
        return torch.cat([prompts, new.to(prompts.device)], 1), torch.tensor(lengths)
