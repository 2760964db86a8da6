"""Parallel-drafting (P-EAGLE) input preparation: one fused pass builds a drafter forward's inputs.

A parallel drafter proposes all ``K`` drafts in one forward: after the committed tokens of the step it appends the
next (bonus or recovered) token and ``K - 1`` mask tokens whose hidden state is a learned vector. Per row, with
``n_b = num_valid[b]`` verified tokens this step (root + accepted drafts), the ``W = T + K - 1`` slots are::

    slot j < n_b - 1           token tokens[b, j + 1]   hidden features[b, j]     (EAGLE shift: token t+1, feature t)
    slot n_b - 1               token next_tokens[b]     hidden features[b, n_b - 1]
    n_b <= j < n_b + K - 1     token mask_token_id      hidden mask_hidden          is_masked
    the rest                   token pad_token_id       hidden 0                    is_rejected
    positions[b, j] = start_positions[b] + j;   sample_indices[b] = n_b - 1 + (0 .. K - 1)

The outputs at ``sample_indices`` are the ``K`` drafts. Rejected slots keep increasing positions (past the row's
real ones, where a drafter's next step overwrites them) rather than vLLM's position 0, because a specdec head
writes its cache at the slot of a token's position.

References:
    - P-EAGLE / parallel drafting in vLLM (``parallel_drafting``, ``copy_and_expand_eagle_inputs_kernel`` in
      ``vllm/v1/spec_decode/utils.py``); PARD, An et al., arXiv 2504.18583.
    - EAGLE: Li et al., arXiv 2401.15077 (feature of token t paired with token t + 1).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = ["ParallelDraftInputs", "parallel_draft_inputs", "parallel_draft_inputs_ref"]


class ParallelDraftInputs(NamedTuple):
    """Inputs of one parallel-drafting forward (``W = T + K - 1`` slots per row).

    Attributes:
        input_ids: Shape ``[B, W]`` int64.
        positions: Shape ``[B, W]`` int64, ``start_positions[b] + j``.
        hidden: Shape ``[B, W, H]`` in the features' dtype.
        is_masked: Shape ``[B, W]`` bool, the ``K - 1`` mask slots.
        is_rejected: Shape ``[B, W]`` bool, padding slots (after the mask slots).
        sample_indices: Shape ``[B, K]`` int64, the slots whose outputs are the ``K`` drafts.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor
    is_masked: torch.Tensor
    is_rejected: torch.Tensor
    sample_indices: torch.Tensor


def _check(tokens, features, num_valid, next_tokens, start_positions, mask_hidden, num_drafts) -> tuple[int, int, int]:
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point:
        raise ValueError("parallel_draft_inputs: tokens must be an int64 tensor of shape [B, T] (root + accepted)")
    batch, width = tokens.shape
    if not isinstance(features, torch.Tensor) or features.dim() != 3 or tuple(features.shape[:2]) != (batch, width):
        raise ValueError(
            f"parallel_draft_inputs: features must have shape [B, T, H] = [{batch}, {width}, H] (the target's "
            f"features at the verified tokens), got {tuple(getattr(features, 'shape', ()))}"
        )
    hidden = features.shape[2]
    for name, t in (("num_valid", num_valid), ("next_tokens", next_tokens), ("start_positions", start_positions)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (batch,):
            raise ValueError(f"parallel_draft_inputs: {name} must have shape [B] = [{batch}]")
    if not isinstance(mask_hidden, torch.Tensor) or tuple(mask_hidden.shape) != (hidden,):
        raise ValueError(
            f"parallel_draft_inputs: mask_hidden must have shape [H] = [{hidden}] (the drafter's learned "
            f"mask_hidden, projected to the features' width), got {tuple(getattr(mask_hidden, 'shape', ()))}"
        )
    if not isinstance(num_drafts, int) or num_drafts < 1:
        raise ValueError(f"parallel_draft_inputs: num_drafts must be an int >= 1 (K drafts per row), "
                         f"got {num_drafts!r}")
    devices = {t.device for t in (tokens, features, num_valid, next_tokens, start_positions, mask_hidden)}
    if len(devices) > 1:
        raise ValueError(f"parallel_draft_inputs: all tensors must be on one device, got {sorted(map(str, devices))}")
    return batch, width, hidden


def parallel_draft_inputs_ref(
    tokens: torch.Tensor,
    features: torch.Tensor,
    num_valid: torch.Tensor,
    next_tokens: torch.Tensor,
    start_positions: torch.Tensor,
    mask_hidden: torch.Tensor,
    *,
    num_drafts: int,
    mask_token_id: int,
    pad_token_id: int = 0,
) -> ParallelDraftInputs:
    """Reference for :func:`parallel_draft_inputs` (same signature and result), in torch.

    Args:
        tokens: Shape ``[B, T]`` int64, the step's verified tokens (root first).
        features: Shape ``[B, T, H]``, the target's features at those tokens.
        num_valid: Shape ``[B]`` int64, verified tokens per row (``0`` for a finished row).
        next_tokens: Shape ``[B]`` int64, the bonus or recovered token.
        start_positions: Shape ``[B]`` int64, position of ``tokens[:, 0]``.
        mask_hidden: Shape ``[H]``, the learned hidden state of mask slots.
        num_drafts: ``K``.
        mask_token_id: token id of the mask slots.
        pad_token_id: token id of the rejected slots.

    Returns:
        :class:`ParallelDraftInputs`.
    """
    batch, width, hidden = _check(tokens, features, num_valid, next_tokens, start_positions, mask_hidden, num_drafts)
    slots = width + num_drafts - 1
    device = tokens.device
    j = torch.arange(slots, device=device)[None, :]
    valid = num_valid.long()[:, None]
    real = j < valid
    is_next = j == valid - 1
    is_masked = (j >= valid) & (j < valid + num_drafts - 1) & (valid >= 1)
    is_rejected = ~(real | is_masked)
    shifted = torch.cat([tokens.long()[:, 1:], tokens.new_full((batch, slots - width + 1), pad_token_id).long()], 1)
    input_ids = torch.where(is_next, next_tokens.long()[:, None], shifted)
    input_ids = torch.where(is_masked, mask_token_id, torch.where(is_rejected, pad_token_id, input_ids))
    padded = torch.cat([features, features.new_zeros(batch, slots - width, hidden)], 1)
    hidden_out = torch.where(real[..., None], padded, torch.zeros_like(padded))
    hidden_out = torch.where(is_masked[..., None], mask_hidden.to(features.dtype), hidden_out)
    positions = start_positions.long()[:, None] + j
    sample_indices = (valid - 1).clamp(min=0) + torch.arange(num_drafts, device=device)[None, :]
    return ParallelDraftInputs(input_ids, positions, hidden_out, is_masked, is_rejected, sample_indices)


@jit
def _parallel_inputs_kernel(tokens_ptr, features_ptr, valid_ptr, next_ptr, start_ptr, mask_hidden_ptr,
                            ids_ptr, positions_ptr, hidden_ptr, masked_ptr, rejected_ptr, sample_ptr,
                            width, slots, hidden, num_drafts, mask_token_id, pad_token_id,
                            stride_tb, stride_tt, stride_fb, stride_ft, stride_fh, stride_m,
                            BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    """One program per (row, slot): its token, position and flags, and its hidden row."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    valid = tl.load(valid_ptr + row)
    real = j < valid
    is_next = j == valid - 1
    is_masked = (j >= valid) & (j < valid + num_drafts - 1) & (valid >= 1)
    shifted = tl.load(tokens_ptr + row * stride_tb + (j + 1) * stride_tt, mask=real & (j + 1 < width), other=0)
    token = tl.where(is_next, tl.load(next_ptr + row), shifted)
    token = tl.where(is_masked, mask_token_id, tl.where(real, token, pad_token_id))
    out = row * slots + j
    tl.store(ids_ptr + out, token.to(tl.int64))
    tl.store(positions_ptr + out, tl.load(start_ptr + row) + j)
    tl.store(masked_ptr + out, is_masked.to(tl.int8))
    tl.store(rejected_ptr + out, (~(real | is_masked)).to(tl.int8))
    for start in range(0, hidden, BLOCK_H):
        dims = start + tl.arange(0, BLOCK_H)
        inside = dims < hidden
        feature = tl.load(features_ptr + row * stride_fb + j * stride_ft + dims * stride_fh,
                          mask=tl.where(real, inside, False), other=0)
        learned = tl.load(mask_hidden_ptr + dims * stride_m, mask=tl.where(is_masked, inside, False), other=0)
        value = tl.where(is_masked, learned, feature)
        tl.store(hidden_ptr + out * hidden + dims, value, mask=inside)
    if j == 0:
        k = tl.arange(0, BLOCK_K)
        tl.store(sample_ptr + row * num_drafts + k, (tl.maximum(valid - 1, 0) + k).to(tl.int64), mask=k < num_drafts)


def _parallel_inputs_triton(tokens, features, num_valid, next_tokens, start_positions, mask_hidden, num_drafts,
                            mask_token_id, pad_token_id) -> ParallelDraftInputs:
    batch, width, hidden = _check(tokens, features, num_valid, next_tokens, start_positions, mask_hidden, num_drafts)
    slots = width + num_drafts - 1
    device = tokens.device
    input_ids = torch.empty(batch, slots, dtype=torch.long, device=device)
    positions = torch.empty(batch, slots, dtype=torch.long, device=device)
    hidden_out = torch.empty(batch, slots, hidden, dtype=features.dtype, device=device)
    is_masked = torch.empty(batch, slots, dtype=torch.bool, device=device)
    is_rejected = torch.empty(batch, slots, dtype=torch.bool, device=device)
    sample_indices = torch.empty(batch, num_drafts, dtype=torch.long, device=device)
    if batch:
        tokens = tokens.long()
        mask_hidden = mask_hidden.to(features.dtype)  # a no-op when the drafter keeps it in the features' dtype
        _parallel_inputs_kernel[(batch, slots)](
            tokens, features, num_valid.long(), next_tokens.long(), start_positions.long(), mask_hidden,
            input_ids, positions, hidden_out, is_masked.view(torch.int8), is_rejected.view(torch.int8),
            sample_indices, width, slots, hidden, num_drafts, mask_token_id, pad_token_id,
            tokens.stride(0), tokens.stride(1) if width else 1, *features.stride(), mask_hidden.stride(0),
            BLOCK_H=min(1024, next_pow2(hidden)), BLOCK_K=next_pow2(num_drafts), **pdl_launch(),
        )
    return ParallelDraftInputs(input_ids, positions, hidden_out, is_masked, is_rejected, sample_indices)


def parallel_draft_inputs(
    tokens: torch.Tensor,
    features: torch.Tensor,
    num_valid: torch.Tensor,
    next_tokens: torch.Tensor,
    start_positions: torch.Tensor,
    mask_hidden: torch.Tensor,
    *,
    num_drafts: int,
    mask_token_id: int,
    pad_token_id: int = 0,
) -> ParallelDraftInputs:
    """Build a parallel drafter's forward inputs in one fused pass: shifted tokens, the next token, ``K - 1``
    mask tokens, padding; features copied, mask slots filled with the learned ``mask_hidden``.

    Layout per row (``n = num_valid[b]``, ``W = T + K - 1`` slots)::

        ids     = [tokens[1:n], next, mask x (K - 1), pad ...]
        hidden  = [features[:n],      mask_hidden x (K - 1), 0 ...]
        positions = start + (0 .. W - 1);  sample_indices = n - 1 + (0 .. K - 1)

    A row with ``n = 0`` (finished) is all padding. Dispatch: the kernel when the tensors are on CUDA and triton
    imports, :func:`parallel_draft_inputs_ref` otherwise; integer outputs are identical and ``hidden`` is a copy
    (bit-identical; ``mask_hidden`` is cast to the features' dtype).

    Args:
        tokens: the step's verified tokens, root first (``Feedback`` path tokens). Shape: ``[B, T]`` int64.
        features: the target's features at those tokens. Shape: ``[B, T, H]``.
        num_valid: verified tokens per row, root included (``num_accepted + 1``; 0 for a finished row).
            Shape: ``[B]`` int64.
        next_tokens: the bonus or recovered token per row. Shape: ``[B]`` int64.
        start_positions: position of ``tokens[:, 0]`` per row. Shape: ``[B]`` int64.
        mask_hidden: the drafter's learned hidden state of mask slots. Shape: ``[H]``.
        num_drafts: ``K`` (``K - 1`` mask slots).
        mask_token_id: token id of mask slots (P-EAGLE ``pard_token`` / ``ptd_token_id``).
        pad_token_id: token id of padding slots.

    Returns:
        :class:`ParallelDraftInputs`.

    Example:
        >>> out = parallel_draft_inputs(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, 2), torch.tensor([2]),
        ...                             torch.tensor([9]), torch.tensor([10]), torch.zeros(2), num_drafts=3,
        ...                             mask_token_id=99)
        >>> out.input_ids.tolist(), out.sample_indices.tolist()
        ([[6, 9, 99, 99, 0]], [[1, 2, 3]])

    References:
        vLLM ``copy_and_expand_eagle_inputs_kernel`` (parallel drafting); PARD arXiv 2504.18583;
        EAGLE arXiv 2401.15077.
    """
    tensors = [tokens, features, num_valid, next_tokens, start_positions, mask_hidden]
    if use_kernel("parallel_draft_inputs", *tensors):
        return _parallel_inputs_triton(tokens, features, num_valid, next_tokens, start_positions, mask_hidden,
                                       num_drafts, mask_token_id, pad_token_id)
    return parallel_draft_inputs_ref(tokens, features, num_valid, next_tokens, start_positions, mask_hidden,
                                     num_drafts=num_drafts, mask_token_id=mask_token_id, pad_token_id=pad_token_id)
