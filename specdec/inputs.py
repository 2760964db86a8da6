"""What ``generate()`` accepts as prompts, and what it refuses, before any model work.

Rules (each refusal names the problem and the fix):

- ``input_ids`` is an int tensor ``[B, T]``, or a tokenizer's ``BatchEncoding`` / a dict holding ``input_ids``
  (and ``attention_mask``), as HF ``generate(**enc)`` users pass them. A Python list is refused with the fix
  (``tokenizer(..., return_tensors="pt")``); other types get a ``TypeError`` naming what is expected.
- ``attention_mask`` (1 = real token) may describe any padding: left, right, or both. The prompts are repacked
  into left padding (each row's real tokens, in order, at the end), which the decoding loop needs; ``sequences``
  then starts with the repacked prompts. A batch that contains the pad id but comes without a mask is refused
  (the pads would be read as text).
- The drafter's vocabulary is checked against the target's by what matters: the ids a shared tokenizer can
  produce. A draft whose embedding is padded past the target's is fine (its extra rows are masked out of its
  logits); a smaller one is refused unless ``tokenizer`` shows it covers every real id.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

__all__ = ["Prompts", "prepare_prompts", "check_prompt_ids", "check_vocabularies", "resolve_pad_token_id"]


class Prompts(NamedTuple):
    """Left-padded prompts, ready for the prefill.

    Attributes:
        input_ids: Shape ``[B, T]`` int64, each row's real tokens at the end (pads: ``pad_token_id``).
        attention_mask: Shape ``[B, T]`` bool, ``True`` at real tokens; ``None`` when no row is padded.
        lengths: real tokens per row (host ints).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    lengths: list[int]


_EXPECTED = ("a LongTensor [B, T] of token ids, or the BatchEncoding / dict that tokenizer(..., "
             "return_tensors='pt') returns")


def _unpack(input_ids, attention_mask):
    if isinstance(input_ids, Mapping):
        if "input_ids" not in input_ids:
            raise TypeError(f"input_ids is a mapping without an 'input_ids' entry (keys: {sorted(input_ids)}); pass "
                            f"{_EXPECTED}")
        if attention_mask is not None and input_ids.get("attention_mask") is not None:
            raise ValueError("attention_mask was given twice (inside the BatchEncoding and as an argument): pass one")
        if attention_mask is None:
            attention_mask = input_ids.get("attention_mask")
        input_ids = input_ids["input_ids"]
    if isinstance(input_ids, (list, tuple)):
        raise TypeError("input_ids is a Python list: tokenize with tokenizer(texts, return_tensors='pt', "
                        "padding=True) and pass the result (or its input_ids and attention_mask)")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids is a {type(input_ids).__name__}: pass {_EXPECTED}")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        if isinstance(attention_mask, (list, tuple)):
            raise TypeError("attention_mask is a Python list: pass a tensor (tokenizer(..., return_tensors='pt'))")
        raise TypeError(f"attention_mask is a {type(attention_mask).__name__}: pass a tensor [B, T] of 0/1")
    return input_ids, attention_mask


def prepare_prompts(input_ids, attention_mask: torch.Tensor | None = None, *,
                    pad_token_id: int | None = None) -> Prompts:
    """Check the prompts and repack any padding the mask describes into left padding.

    Math: row ``b``'s prompt is the subsequence of its tokens where ``attention_mask[b] == 1``, in order; it is
    written at the end of the row, pads (``pad_token_id``) before it. Already left-padded rows are unchanged.

    Args:
        input_ids: a tensor, a ``BatchEncoding`` or a dict with ``input_ids`` (and ``attention_mask``).
            Shape: ``[B, T]`` int.
        attention_mask: 1 (or ``True``) for real tokens; any padding. ``None``: every token is real.
            Shape: ``[B, T]``.
        pad_token_id: the model's pad id, if it has one: without a mask, a batch containing it is refused;
            with a mask, it fills the repacked padding (default 0).

    Returns:
        :class:`Prompts`.

    Raises:
        TypeError: input of the wrong type (names what is expected).
        ValueError: wrong shapes, no rows, a mask that is not 0/1, a row without a real token, or pad ids without a
            mask.
    """
    # Host syncs below (reading the pad ids, the mask's values and lengths): once per call, before any model work.
    ids, mask = _unpack(input_ids, attention_mask)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must have shape [B, T], got {tuple(ids.shape)}; add a batch dimension with "
                         f"input_ids[None].")
    if ids.shape[1] == 0:
        raise ValueError("input_ids is empty: give at least one prompt token.")
    if ids.shape[0] == 0:
        raise ValueError(f"input_ids has no rows (shape {tuple(ids.shape)}): give at least one prompt.")
    B, T = ids.shape
    if mask is None:
        if pad_token_id is not None and bool((ids == pad_token_id).any()):
            raise ValueError(
                f"input_ids contains the pad token id {pad_token_id} but no attention_mask was given, so the pads "
                f"would be read as text: pass attention_mask (1 for real tokens), e.g. the one "
                f"tokenizer(..., return_tensors='pt', padding=True) returns. If {pad_token_id} is a real token of "
                f"your prompts, pass attention_mask=torch.ones_like(input_ids).")
        return Prompts(input_ids=ids, attention_mask=None, lengths=[T] * B)
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"attention_mask shape {tuple(mask.shape)} differs from input_ids {(B, T)}.")
    mask = mask.to(ids.device)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 and 1 (1 = real token); got other values. A 4-D or "
                         "additive mask is not a padding mask: pass the tokenizer's 2-D mask.")
    valid = mask.bool()
    lengths = valid.sum(1).tolist()
    if min(lengths) == 0:
        raise ValueError(f"row {lengths.index(0)} of attention_mask has no real token: every prompt needs at least "
                         f"one.")
    if min(lengths) == T:
        return Prompts(input_ids=ids, attention_mask=None, lengths=lengths)
    left_padded = bool((valid[:, 1:] >= valid[:, :-1]).all())  # once a row is real, it stays real
    if not left_padded:
        # Stable sort puts each row's pads first and keeps its real tokens in order.
        order = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices
        valid = valid.gather(1, order)
        ids = ids.gather(1, order).masked_fill(~valid, 0 if pad_token_id is None else pad_token_id)
    return Prompts(input_ids=ids, attention_mask=valid, lengths=lengths)


def check_prompt_ids(ids: torch.Tensor, num_embeddings: int | None) -> None:
    """Refuse prompt ids outside the target's embedding, pads included (the model embeds every position, as HF's
    ``generate`` does): the embedding would fail with an opaque index error on CPU, a device-side assert on CUDA.
    One host sync.

    Args:
        ids: Shape ``[B, T]``, the prompts (on the target's device).
        num_embeddings: the target's embedding rows (``None``: nothing checked).

    Raises:
        ValueError: an id below 0 or at least ``num_embeddings``, named with the fix.
    """
    if num_embeddings is None or ids.numel() == 0:
        return
    low, high = torch.stack([ids.min(), ids.max()]).tolist()
    if low < 0 or high >= num_embeddings:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids holds the token id {bad}, outside the target's embedding [0, {num_embeddings}):"
                         f" tokenize with the target's tokenizer, and pad with an id of its vocabulary (its pad id).")


def resolve_pad_token_id(model, pad_token_id: int | None) -> int | None:
    """The pad id to use: the argument, else the model's ``generation_config`` / ``config`` pad id, else ``None``."""
    if pad_token_id is not None:
        return pad_token_id
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(config, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return None


def check_vocabularies(target_vocab: int | None, drafter, tokenizer=None) -> None:
    """Refuse a drafter whose vocabulary cannot be the target's, comparing the ids a tokenizer can produce.

    Rule: with ``V_t`` the target's vocabulary (its logits' width), ``V_d`` the drafter's (``drafter.vocab_size``)
    and ``n = len(tokenizer)`` when given: need ``n <= min(V_t, V_d)``; without a tokenizer, need
    ``V_d >= V_t`` (a draft padded past the target is fine: its rows ``>= V_t`` are masked out of its logits).

    Args:
        target_vocab: ``V_t`` (``None`` skips the check).
        drafter: the drafter (its ``vocab_size``, if it has one, is checked).
        tokenizer: the shared tokenizer, if known (``len(tokenizer)`` real ids).

    Raises:
        ValueError: saying which sizes it saw and what to do.
    """
    draft_vocab = getattr(drafter, "vocab_size", None)
    if target_vocab is None or draft_vocab is None or draft_vocab == target_vocab:
        return
    if tokenizer is not None:
        real = len(tokenizer)
        if real > min(draft_vocab, target_vocab):
            raise ValueError(
                f"the tokenizer produces {real} ids but the drafter's vocabulary has {draft_vocab} and the target's "
                f"{target_vocab}: both must cover every id of one shared tokenizer (a draft for another tokenizer "
                f"cannot propose the target's tokens).")
        return
    if draft_vocab < target_vocab:
        raise ValueError(
            f"the drafter's vocabulary ({draft_vocab} ids) is smaller than the target's ({target_vocab}): draft and "
            f"target must share one tokenizer. If the target's embedding is only padded past a tokenizer that the "
            f"draft covers, pass tokenizer=... so that the ids it can produce (len(tokenizer)) are compared instead.")
