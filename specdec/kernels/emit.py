"""The tokens a verified step emits, in vLLM's ``[B, D + 1]``, ``-1``-padded layout: one launch.

Math: row ``b`` emits ``tokens[b, accepted_nodes[b, j] - 1]`` for ``j = 1..num_accepted[b]`` (the accepted drafts,
in path order), then ``next_tokens[b]`` (the bonus or recovered token); the columns after those ``num_accepted[b]
+ 1`` hold ``-1``. The reference is the torch code :func:`specdec.verify.emitted_tokens` ran before (a gather, a
pad column, two ``where``s: about a dozen launches); the kernel is one program per row.

References:
    vLLM v1 rejection sampler (``vllm/v1/sample/rejection_sampler.py``): the glossary (accepted, recovered, bonus
    tokens) and the ``[B, K + 1]`` output with ``-1`` placeholders.
"""
from __future__ import annotations

import torch

from ._dispatch import use_kernel
from ._triton import jit, next_pow2, tl

__all__ = ["emitted_tokens", "emitted_tokens_ref"]


def _check(draft_tokens, accepted_nodes, num_accepted, next_tokens) -> tuple[int, int]:
    if draft_tokens.dim() != 2 or accepted_nodes.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, N] and accepted_nodes [B, D + 1], got "
                         f"{tuple(draft_tokens.shape)} and {tuple(accepted_nodes.shape)}")
    batch, width = accepted_nodes.shape
    if width < 1 or draft_tokens.shape[0] != batch or tuple(num_accepted.shape) != (batch,) \
            or tuple(next_tokens.shape) != (batch,):
        raise ValueError(f"emitted_tokens needs accepted_nodes [B, D + 1] with D + 1 >= 1 and num_accepted, "
                         f"next_tokens [B] for the B = {batch} rows of draft_tokens; got accepted_nodes "
                         f"{tuple(accepted_nodes.shape)}, num_accepted {tuple(num_accepted.shape)}, next_tokens "
                         f"{tuple(next_tokens.shape)} (pass a VerifyResult's fields as they are)")
    return batch, width


def emitted_tokens_ref(draft_tokens: torch.Tensor, accepted_nodes: torch.Tensor, num_accepted: torch.Tensor,
                       next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`emitted_tokens` (same signature and result).

    Args:
        draft_tokens: Shape ``[B, N]``, the draft's tokens (node ``i`` holds ``draft_tokens[:, i - 1]``).
        accepted_nodes: Shape ``[B, D + 1]``, the accepted path as node indices (root first), ``-1`` padded.
        num_accepted: Shape ``[B]``, accepted drafts per row.
        next_tokens: Shape ``[B]``, the bonus or recovered token per row.

    Returns:
        ``(tokens [B, D + 1], counts [B] = num_accepted + 1)``, ``tokens`` ``-1`` after each row's count.
    """
    _check(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    nodes = accepted_nodes[:, 1:]
    on_path = nodes > 0
    node_tokens = draft_tokens.gather(1, (nodes - 1).clamp_min(0)) if draft_tokens.shape[1] else nodes.clone()
    node_tokens = torch.where(on_path, node_tokens, torch.full_like(node_tokens, -1))
    # The next token's column: built from the row count, not from node_tokens, which has no columns for D = 0.
    tokens = torch.cat([node_tokens, node_tokens.new_full((node_tokens.shape[0], 1), -1)], dim=1)
    column = torch.arange(tokens.shape[1], device=tokens.device)[None]
    count = num_accepted[:, None]
    tokens = torch.where(column == count, next_tokens[:, None].to(tokens.dtype), tokens)
    tokens = torch.where(column > count, torch.full_like(tokens, -1), tokens)
    return tokens, num_accepted + 1


@jit
def _emit_kernel(tokens_ptr, path_ptr, num_ptr, next_ptr, out_ptr, count_ptr, width,
                 stride_tb, stride_tn, stride_pb, stride_pn, BLOCK: tl.constexpr):
    """One row: column j < n takes the token of path node j + 1, column n the next token, later columns -1."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    n = tl.load(num_ptr + row)
    nxt = tl.load(next_ptr + row)
    node = tl.load(path_ptr + row * stride_pb + (cols + 1) * stride_pn, mask=cols + 1 < width, other=0)
    take = (cols < n) & (node > 0)
    token = tl.load(tokens_ptr + row * stride_tb + (node - 1) * stride_tn, mask=take, other=-1)
    out = tl.where(cols == n, nxt, tl.where(cols < n, token, -1))
    tl.store(out_ptr + row * width + cols, out, mask=cols < width)
    tl.store(count_ptr + row, n + 1)


def _emitted_tokens_triton(draft_tokens, accepted_nodes, num_accepted, next_tokens):
    batch, width = _check(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    dtype = draft_tokens.dtype if draft_tokens.shape[1] else accepted_nodes.dtype
    tokens = torch.empty(batch, width, dtype=dtype, device=accepted_nodes.device)
    counts = torch.empty_like(num_accepted)
    if batch:
        source = draft_tokens if draft_tokens.shape[1] else accepted_nodes  # never read when N = 0
        _emit_kernel[(batch,)](
            source, accepted_nodes, num_accepted, next_tokens.to(dtype), tokens, counts, width,
            source.stride(0), source.stride(1), accepted_nodes.stride(0), accepted_nodes.stride(1),
            BLOCK=next_pow2(width),
        )
    return tokens, counts


def emitted_tokens(draft_tokens: torch.Tensor, accepted_nodes: torch.Tensor, num_accepted: torch.Tensor,
                   next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens each row emits after verification: its accepted drafts, then the next token (one launch on CUDA).

    Math: ``tokens[b, j] = draft_tokens[b, accepted_nodes[b, j + 1] - 1]`` for ``j < num_accepted[b]``,
    ``tokens[b, num_accepted[b]] = next_tokens[b]``, ``-1`` after.

    Args:
        draft_tokens: Shape ``[B, N]`` int64, the draft's tokens.
        accepted_nodes: Shape ``[B, D + 1]`` int64, the accepted path (``VerifyResult.accepted_nodes``).
        num_accepted: Shape ``[B]`` int64 (``VerifyResult.num_accepted``).
        next_tokens: Shape ``[B]`` int64 (``VerifyResult.next_tokens``).

    Returns:
        ``(tokens [B, D + 1], counts [B])``, ``counts = num_accepted + 1``.

    Raises:
        ValueError: shapes that do not fit together (the message names them).

    Example:
        >>> emitted_tokens(torch.tensor([[5, 6]]), torch.tensor([[0, 1, -1]]), torch.tensor([1]),
        ...                torch.tensor([9]))[0].tolist()
        [[5, 9, -1]]
    """
    if use_kernel("emitted_tokens", draft_tokens, accepted_nodes, num_accepted, next_tokens):
        return _emitted_tokens_triton(draft_tokens, accepted_nodes, num_accepted, next_tokens)
    return emitted_tokens_ref(draft_tokens, accepted_nodes, num_accepted, next_tokens)
