"""Verification kernels: greedy (chains and trees), chain rejection sampling and target-only tree rejection
sampling under pre-drawn noise.

Three ops, each a kernel plus a torch reference of the same signature:

- :func:`verify_greedy`: drop-in for :func:`specdec.verify.verify_greedy` (its reference *is* that function).
  Kernel 1 reduces every node's logits to argmax partials over vocabulary chunks (the memory-bound part, spread
  over ``B * (N + 1) * chunks`` programs); kernel 2, one program per row, finishes the argmaxes, marks the drafts
  that equal their parent's argmax, ANDs that over each path by pointer doubling in registers, picks the
  deepest accepted node and writes the path.
- :func:`verify_chain_noise`: Leviathan / Chen speculative sampling of chains, with the randomness passed in:
  ``uniforms [B, N]`` decide acceptance, ``exponentials [B, V]`` draw the next token by an exponential race over
  the *unnormalised* residual (or the target row, for the bonus token).
- :func:`verify_tree_deterministic_noise`: target-only recursive rejection for trees of deterministic drafts
  (EAGLE-2 top-k trees, n-gram lookup), the verifier sampled EAGLE-2 and prompt lookup use, under the same noise.

Randomness stays outside the kernels (:func:`draw_verify_noise` draws it from a
:class:`~specdec.sampling.TorchSource` or generator), and every comparison is written so that the kernel and
the reference do the same IEEE float64 operations (``u * q < p`` rather than ``u < p / q``, ``w / E`` rather
than ``log w - log E``): integer outputs are identical, not merely close.

Noise-form rules (exact in law; the Monte-Carlo tests in ``tests/test_kernels_verify.py`` check it):

- chain: draft ``k`` (node ``k + 1``) is accepted iff ``q_k(x_k) > 0`` and ``u_k * q_k(x_k) < p_k(x_k)``
  (``q = 1`` for deterministic drafts), i.e. with probability ``min(1, p/q)``; ``n`` = the first rejected
  position. Next token: ``argmax_v w_v / E_v`` over ``w = max(p_n - q_n, 0)`` after a rejection (``p_n`` with
  ``x_n`` removed for deterministic drafts), ``w = p_n`` when all drafts were accepted (bonus). Lanes with
  ``w_v = 0`` never win; a residual without mass (a rounding accident) falls back to ``p_n``.
- target-only tree: at the current node with target ``p`` try its children in index order; child ``x`` is
  accepted iff ``u * (1 - m) < p(x)`` where ``m`` is the mass of the children rejected so far at that node
  (so with probability ``p(x) / (1 - m)``, the normalised residual at ``x``); a child repeating a rejected token
  is rejected. Next token: the race over ``p`` at the last accepted node with its (all rejected) children's
  tokens removed.

References:
    - Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", arXiv 2211.17192.
    - Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling", arXiv 2302.01318.
    - Li et al., "EAGLE-2", arXiv 2406.16858 (target-only verification of top-k trees).
    - vLLM v1 rejection sampler (noise drawn outside the kernel, exponential race, masked lanes at -inf);
      SGLang ``verify_tree_greedy`` / ``tree_speculative_sampling_target_only``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import verify as _verify
from ..sampling import NoiseSource, TorchSource
from ..types import Draft, DraftScheme, VerifyResult
from ._dispatch import use_kernel
from ._triton import INTERPRETED, jit, next_pow2, pdl_launch, pdl_start, tl

__all__ = [
    "VerifyNoise",
    "draw_verify_noise",
    "verify_greedy",
    "verify_greedy_ref",
    "verify_chain_noise",
    "verify_chain_noise_ref",
    "verify_tree_deterministic_noise",
    "verify_tree_deterministic_noise_ref",
]

# Enough programs to fill an H200 (132 SMs) twice over; chunks of the vocabulary are at least one tile wide. The
# interpreter runs programs one after another, so there a row gets at most two chunks (which still exercises the
# cross-chunk reduction).
_TARGET_PROGRAMS = 2 if INTERPRETED else 264
# Vocabulary tile. The interpreter pays per tile, not per lane, so it takes wider tiles (same code paths: partial
# last tiles and the strict cross-tile comparison are exercised at V = 8193 and 151936 either way).
_BLOCK_V = 8192 if INTERPRETED else 1024


class VerifyNoise(NamedTuple):
    """The randomness one noise-form verification step consumes, drawn before the call.

    Attributes:
        uniforms: Shape ``[B, N]`` float64 in ``[0, 1)``, one per draft node (node ``i`` uses column ``i - 1``).
        exponentials: Shape ``[B, V]`` float64 ``Exp(1)`` noise for the next token's exponential race.
    """

    uniforms: torch.Tensor
    exponentials: torch.Tensor


def draw_verify_noise(
    source: NoiseSource | torch.Generator, batch: int, num_nodes: int, vocab: int, device: torch.device | str
) -> VerifyNoise:
    """Draw the noise of one step of :func:`verify_chain_noise` / :func:`verify_tree_deterministic_noise`.

    Uniforms first, then exponentials (one call each), so a seeded source gives reproducible steps.

    Args:
        source: a :class:`~specdec.sampling.TorchSource`, :class:`~specdec.sampling.PredrawnNoise` (any
            :class:`~specdec.sampling.NoiseSource`) or a ``torch.Generator`` on ``device``.
        batch: ``B``. num_nodes: ``N`` draft nodes. vocab: ``V``.
        device: where the noise is needed.

    Returns:
        :class:`VerifyNoise` ``(uniforms [B, N], exponentials [B, V])``, float64.

    Example:
        >>> noise = draw_verify_noise(torch.Generator().manual_seed(0), 2, 3, 5, "cpu")
        >>> tuple(noise.uniforms.shape), tuple(noise.exponentials.shape)
        ((2, 3), (2, 5))
    """
    if isinstance(source, torch.Generator):
        source = TorchSource(source)
    if not isinstance(source, NoiseSource):
        raise TypeError(
            f"draw_verify_noise needs raw noise: pass a torch.Generator, a TorchSource or a PredrawnNoise, got "
            f"{type(source).__name__} (a RandomSource that only answers bernoulli/categorical cannot be pre-drawn)"
        )
    device = torch.device(device)
    uniforms = source.uniforms(torch.Size((batch, num_nodes)), device)
    exponentials = source.exponentials(torch.Size((batch, vocab)), device)
    return VerifyNoise(uniforms, exponentials)


# ----------------------------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------------------------


def _check_noise(name: str, uniforms: torch.Tensor, exponentials: torch.Tensor, batch: int, nodes: int, vocab: int):
    if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != (batch, nodes):
        raise ValueError(
            f"{name}: uniforms must have shape [B, N] = [{batch}, {nodes}] (one per draft node), got "
            f"{tuple(getattr(uniforms, 'shape', ()))}; draw them with draw_verify_noise(source, B, N, V, device)"
        )
    if not isinstance(exponentials, torch.Tensor) or tuple(exponentials.shape) != (batch, vocab):
        raise ValueError(
            f"{name}: exponentials must have shape [B, V] = [{batch}, {vocab}], got "
            f"{tuple(getattr(exponentials, 'shape', ()))}; draw them with draw_verify_noise(source, B, N, V, device)"
        )
    if not (uniforms.is_floating_point() and exponentials.is_floating_point()):
        raise ValueError(f"{name}: uniforms and exponentials must be float tensors (float64 preferred)")


def _depth(draft: Draft, max_depth: int | None) -> int:
    # As in specdec.verify: reading the depth is a host sync; a compiled tree (or K) knows it statically.
    return draft.max_depth if max_depth is None else int(max_depth)


def _chunks(rows: int, vocab: int, block: int) -> tuple[int, int]:
    """Split the vocabulary into chunks (a multiple of ``block`` wide) so that ``rows * chunks`` fills the GPU."""
    tiles = -(-vocab // block)
    wanted = max(1, min(tiles, -(-_TARGET_PROGRAMS // max(rows, 1))))
    chunk = -(-tiles // wanted) * block
    return chunk, -(-vocab // chunk)


# ----------------------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------------------


@jit
def _finish_argmax_rows(val_ptr, idx_ptr, rows, num_chunks, BLOCK_C: tl.constexpr):
    """Each row's argmax from its ``num_chunks`` partial (value, index) pairs, in one load of the ``[rows,
    num_chunks]`` partials; the first chunk wins ties (the partials are never NaN; missing chunks read ``-inf`` and
    chunk 0 always exists)."""
    c = tl.arange(0, BLOCK_C)
    c_in = c < num_chunks
    values = tl.load(val_ptr + rows[:, None] * num_chunks + c[None, :], mask=c_in[None, :], other=-float("inf"))
    best = tl.argmax(values, 1, tie_break_left=True)
    return tl.load(idx_ptr + rows * num_chunks + best)


@jit
def _pick(vector, ids, at):
    """``vector[at]`` for a register vector indexed by ``ids`` (``at`` a scalar): a one-hot reduction, no memory
    access."""
    return tl.sum(tl.where(ids == at, vector, 0), 0)


@jit
def _pick_each(vector, ids, at):
    """``vector[at]`` for a vector of indices ``at`` (:func:`_pick` of each)."""
    return tl.sum(tl.where(at[:, None] == ids[None, :], vector[None, :], 0), 1)


@jit
def _write_path_regs(path_ptr, num_ptr, row, node, parents, depths, ids, path_width, BLOCK_D: tl.constexpr):
    """:func:`_write_path` from the row's parents and depths held in registers (``ids`` their node indices)."""
    cols = tl.arange(0, BLOCK_D)
    current = node.to(tl.int64)
    path = tl.where(cols == 0, 0, -1).to(tl.int64)
    tl.store(num_ptr + row, _pick(depths, ids, current).to(tl.int64))
    while current > 0:
        path = tl.where(cols == _pick(depths, ids, current), current, path)
        parent = _pick(parents, ids, current).to(tl.int64)
        current = tl.where(parent < current, parent, 0)  # parents precede children; stop on malformed input
    tl.store(path_ptr + row * path_width + cols, path, mask=cols < path_width)


@jit
def _write_path(path_ptr, num_ptr, row, node, parents_ptr, depths_ptr, stride_pb, stride_pn, stride_db, stride_dn,
                path_width, BLOCK_D: tl.constexpr):
    """Root-to-``node`` path of row ``row`` into ``path[row, :path_width]`` (-1 padded), and ``depth(node)``."""
    cols = tl.arange(0, BLOCK_D)
    current = node.to(tl.int64)
    path = tl.where(cols == 0, 0, -1).to(tl.int64)
    tl.store(num_ptr + row, tl.load(depths_ptr + row * stride_db + current * stride_dn))
    while current > 0:
        depth = tl.load(depths_ptr + row * stride_db + current * stride_dn)
        path = tl.where(cols == depth, current, path)
        parent = tl.load(parents_ptr + row * stride_pb + current * stride_pn)
        current = tl.where(parent < current, parent, 0)  # parents precede children; stop on malformed input
    tl.store(path_ptr + row * path_width + cols, path, mask=cols < path_width)


@jit
def _race_tile(weights, exps, lanes_ok, best, index, start):
    """One tile (lanes ``start + 0..``) of the exponential race ``argmax w / E``, folded into ``(best, index)``.

    Lanes with ``w <= 0`` or outside the vocabulary score ``-inf``: they never win, not even a tie. Earlier lanes
    win ties (first tile by strict ``>``, within a tile by the tie-break), as ``torch.argmax`` does.
    """
    score = tl.where(lanes_ok & (weights > 0), weights / exps, -float("inf"))
    tile_best, tile_index = tl.max(score, 0, return_indices=True, return_indices_tie_break_left=True)
    take = tile_best > best
    return tl.where(take, tile_best, best), tl.where(take, start + tile_index, index)


@jit
def _race_start(c, chunk, vocab):
    """Vocabulary chunk ``c``'s lanes ``[lo, hi)`` and two empty races (residual, target) starting at ``lo``."""
    lo = c * chunk
    hi = tl.minimum(lo + chunk, vocab)
    return lo, hi, tl.full((), -float("inf"), tl.float64), lo, tl.full((), -float("inf"), tl.float64), lo


@jit
def _store_partials(score_ptr, index_ptr, base, best_r, index_r, best_p, index_p):
    """Write a chunk's two race winners (residual race, then target race) at ``base`` of the partials."""
    tl.store(score_ptr + base, best_r)
    tl.store(index_ptr + base, index_r)
    tl.store(score_ptr + base + 1, best_p)
    tl.store(index_ptr + base + 1, index_p)


@jit
def _race_finish_kernel(score_ptr, index_ptr, current_ptr, next_ptr, path_ptr, num_ptr, parents_ptr, depths_ptr,
                        num_chunks, path_width, stride_pb, stride_pn, stride_db, stride_dn, BLOCK_D: tl.constexpr,
                        PDL: tl.constexpr = False):
    """Per row: the next token from the race partials (residual first, the target row if it had no mass), and
    the accepted path ending at ``current``."""
    pdl_start(PDL)
    row = tl.program_id(0)
    base = row * num_chunks * 2
    best_r = tl.load(score_ptr + base)
    index_r = tl.load(index_ptr + base)
    best_p = tl.load(score_ptr + base + 1)
    index_p = tl.load(index_ptr + base + 1)
    for c in range(1, num_chunks):
        value = tl.load(score_ptr + base + 2 * c)
        take = value > best_r
        best_r = tl.where(take, value, best_r)
        index_r = tl.where(take, tl.load(index_ptr + base + 2 * c), index_r)
        value = tl.load(score_ptr + base + 2 * c + 1)
        take = value > best_p
        best_p = tl.where(take, value, best_p)
        index_p = tl.where(take, tl.load(index_ptr + base + 2 * c + 1), index_p)
    fallback = tl.where(best_p > -float("inf"), index_p, 0)
    tl.store(next_ptr + row, tl.where(best_r > -float("inf"), index_r, fallback).to(tl.int64))
    _write_path(path_ptr, num_ptr, row, tl.load(current_ptr + row), parents_ptr, depths_ptr, stride_pb, stride_pn,
                stride_db, stride_dn, path_width, BLOCK_D)


def _race_ref(weights: torch.Tensor, exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``argmax_v w_v / E_v`` over lanes with ``w_v > 0`` (float64), and whether any lane had mass."""
    positive = weights > 0
    score = torch.where(positive, weights / exponentials, torch.full_like(weights, -math.inf))
    return score.argmax(-1), positive.any(-1)


def _next_token_ref(residual: torch.Tensor, target: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    index_r, has_r = _race_ref(residual, exponentials)
    index_p, has_p = _race_ref(target, exponentials)
    return torch.where(has_r, index_r, torch.where(has_p, index_p, torch.zeros_like(index_p)))


def _result_ref(node: torch.Tensor, next_tokens: torch.Tensor, draft: Draft, depth: int) -> VerifyResult:
    return _verify._result(node, next_tokens, draft, depth)


# ----------------------------------------------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------------------------------------------


def verify_greedy_ref(
    target_probs: torch.Tensor, draft: Draft, source=None, *, max_depth: int | None = None
) -> VerifyResult:
    """Reference for :func:`verify_greedy`: :func:`specdec.verify.verify_greedy` itself (same signature).

    Args:
        target_probs: Shape ``[B, N + 1, V]``, target logits or probabilities at every node.
        draft: the draft tree (tokens ``[B, N]``, parents and depths ``[B, N + 1]``).
        source: ignored (greedy draws nothing).
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult`.
    """
    return _verify.verify_greedy(target_probs, draft, source, max_depth=max_depth)


@jit
def _argmax_partials_kernel(x_ptr, val_ptr, idx_ptr, width, vocab, chunk, num_chunks, stride_b, stride_n, stride_v,
                            F64: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):
    """Partial argmax of one node's row over one vocabulary chunk (ties: lowest id)."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    base = x_ptr + (row // width) * stride_b + (row % width) * stride_n
    lo = c * chunk
    hi = tl.minimum(lo + chunk, vocab)
    best = tl.full((), -float("inf"), tl.float64 if F64 else tl.float32)
    index = lo
    for start in range(lo, hi, BLOCK_V):
        lanes = start + tl.arange(0, BLOCK_V)
        x = tl.load(base + lanes * stride_v, mask=lanes < hi, other=-float("inf"))
        x = x.to(tl.float64) if F64 else x.to(tl.float32)
        tile_best, tile_index = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        take = tile_best > best
        best = tl.where(take, tile_best, best)
        index = tl.where(take, start + tile_index, index)
    tl.store(val_ptr + row * num_chunks + c, best)
    tl.store(idx_ptr + row * num_chunks + c, index)


@jit
def _greedy_walk_kernel(val_ptr, idx_ptr, tokens_ptr, parents_ptr, depths_ptr, path_ptr, num_ptr, next_ptr,
                        nodes, num_chunks, rounds, path_width,
                        stride_tb, stride_tn, stride_pb, stride_pn, stride_db, stride_dn,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                        PDL: tl.constexpr = False):
    """Per row: accepted = draft equals its parent's argmax, ANDed over the path; deepest accepted node wins. Every
    node's argmax comes from one load of the partials; parents' argmaxes, the next token and the path are then read
    from registers (no chain of dependent memory reads)."""
    pdl_start(PDL)
    row = tl.program_id(0)
    width = nodes + 1
    ids = tl.arange(0, BLOCK_N)
    live = ids < width
    parents = tl.load(parents_ptr + row * stride_pb + ids * stride_pn, mask=live, other=-1)
    depths = tl.load(depths_ptr + row * stride_db + ids * stride_dn, mask=live, other=0)
    tokens = tl.load(tokens_ptr + row * stride_tb + (ids - 1) * stride_tn, mask=live & (ids >= 1), other=-1)
    argmax = _finish_argmax_rows(val_ptr, idx_ptr, row * width + tl.where(live, ids, 0), num_chunks, BLOCK_C)
    at_parent = _pick_each(argmax, ids, tl.maximum(parents, 0).to(tl.int32))
    accepted = ((parents >= 0) & (ids >= 1) & live & (tokens == at_parent)) | (ids == 0)
    # AND over each node's path by pointer doubling; a gather from registers is a one-hot reduction.
    jump = tl.where((parents >= 0) & (ids > 0), parents, ids)
    for _ in range(rounds):
        hit = jump[:, None] == ids[None, :]
        accepted = accepted & (tl.max(tl.where(hit, accepted.to(tl.int32)[None, :], 0), 1) > 0)
        jump = tl.sum(tl.where(hit, jump[None, :], 0), 1)
    score = tl.where(accepted & live, depths, -1)
    best = tl.argmax(score, 0, tie_break_left=True)
    tl.store(next_ptr + row, _pick(argmax, ids, best).to(tl.int64))
    _write_path_regs(path_ptr, num_ptr, row, best, parents, depths, ids, path_width, BLOCK_D)


def _verify_greedy_triton(target_probs: torch.Tensor, draft: Draft, max_depth: int | None) -> VerifyResult:
    _verify._check_inputs(target_probs, draft, False, "verify_greedy")
    depth = _depth(draft, max_depth)
    batch, nodes = draft.tokens.shape
    vocab = target_probs.shape[-1]
    device = target_probs.device
    width = nodes + 1
    f64 = target_probs.dtype == torch.float64
    chunk, num_chunks = _chunks(batch * width, vocab, _BLOCK_V)
    values = torch.empty(batch * width, num_chunks, dtype=torch.float64 if f64 else torch.float32, device=device)
    indices = torch.empty(batch * width, num_chunks, dtype=torch.int32, device=device)
    # The three outputs in one allocation (contiguous views): [B, D + 1] path, then [B] counts, then [B] tokens.
    flat = torch.empty(batch * (depth + 3), dtype=torch.long, device=device)
    path = flat[:batch * (depth + 1)].view(batch, depth + 1)
    num_accepted, next_tokens = flat[batch * (depth + 1):].view(2, batch).unbind(0)
    if batch == 0:
        return VerifyResult(path, num_accepted, next_tokens)
    _argmax_partials_kernel[(batch * width, num_chunks)](
        target_probs, values, indices, width, vocab, chunk, num_chunks, *target_probs.stride(),
        F64=f64, BLOCK_V=_BLOCK_V, **pdl_launch(),
    )
    parents, depths = draft.parents.long(), draft.depths.long()
    tokens = draft.tokens.long() if nodes else parents  # never read without drafts; avoids a null pointer
    _greedy_walk_kernel[(batch,)](
        values, indices, tokens, parents, depths, path, num_accepted, next_tokens,
        nodes, num_chunks, max(nodes.bit_length(), 1), depth + 1,
        *tokens.stride(), *parents.stride(), *depths.stride(),
        BLOCK_N=next_pow2(width), BLOCK_D=next_pow2(depth + 1), BLOCK_C=next_pow2(num_chunks), **pdl_launch(),
    )
    return VerifyResult(path, num_accepted, next_tokens)


def verify_greedy(
    target_probs: torch.Tensor, draft: Draft, source=None, *, max_depth: int | None = None
) -> VerifyResult:
    """Greedy verification of a tree or chain in two launches; same signature and result as
    :func:`specdec.verify.verify_greedy`.

    Math: ``a_i = argmax_v target[i, v]`` (ties to the lowest id); node ``i`` is accepted iff ``token_i ==
    a_parent(i)`` and its parent is accepted (the root always is); the chosen node ``n*`` is the deepest accepted
    node (ties: smallest index); the next token is ``a_{n*}``. Absent nodes are never accepted; a row with no
    drafts emits ``a_0``.

    Dispatch: the kernels when the tensors are on CUDA and triton imports, :func:`verify_greedy_ref` otherwise.
    NaN logits: unspecified (the reference treats NaN as the maximum, the kernel does not).

    Args:
        target_probs: target logits or probabilities at every node (only the argmax is used; any float dtype).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree (any scheme; ``draft_probs`` is ignored).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        source: ignored (greedy draws nothing); accepted so that every verifier has one signature.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult` (``accepted_nodes [B, D + 1]``, ``num_accepted [B]``,
        ``next_tokens [B]``).

    References:
        Cai et al., "Medusa", arXiv 2401.10774; Li et al., "EAGLE-2", arXiv 2406.16858; SGLang
        ``verify_tree_greedy``; vLLM ``rejection_greedy_sample_kernel``.
    """
    if use_kernel("verify_greedy", target_probs, draft.tokens, draft.parents, draft.depths):
        return _verify_greedy_triton(target_probs, draft, max_depth)
    return verify_greedy_ref(target_probs, draft, source, max_depth=max_depth)


verify_greedy.lossless = verify_greedy_ref.lossless = True
verify_greedy.exact_for = verify_greedy_ref.exact_for = _verify.verify_greedy.exact_for


# ----------------------------------------------------------------------------------------------------------------
# Chain rejection sampling under pre-drawn noise
# ----------------------------------------------------------------------------------------------------------------



# The same contract marks as the reference (lossless, exact for every scheme at T = 0, fed raw logits), so
# ``select_verifier`` can hand out this dispatching form.
verify_greedy.lossless = _verify.verify_greedy.lossless
verify_greedy.exact_for = _verify.verify_greedy.exact_for
verify_greedy.takes_logits = _verify.verify_greedy.takes_logits

def _chain_inputs(name, target_probs, draft, uniforms, exponentials):
    one_hot = draft.scheme == DraftScheme.DETERMINISTIC
    batch, nodes, vocab = _verify._check_inputs(target_probs, draft, not one_hot, name)
    _check_noise(name, uniforms, exponentials, batch, nodes, vocab)
    return one_hot, batch, nodes, vocab


def verify_chain_noise_ref(
    target_probs: torch.Tensor,
    draft: Draft,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Reference for :func:`verify_chain_noise` (same signature and result), vectorised torch in float64.

    Args:
        target_probs: Shape ``[B, N + 1, V]``, processed target distributions.
        draft: a chain per row (present nodes ``1..K_b`` then absent ones); ``draft_probs [B, N, V]`` for sampled
            schemes.
        uniforms: Shape ``[B, N]``, ``U[0, 1)`` noise.
        exponentials: Shape ``[B, V]``, ``Exp(1)`` noise.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult`.
    """
    one_hot, batch, nodes, vocab = _chain_inputs("verify_chain_noise", target_probs, draft, uniforms, exponentials)
    depth = _depth(draft, max_depth)
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    target = target_probs.double()
    exponentials = exponentials.double()
    if nodes == 0:
        start = torch.zeros(batch, dtype=torch.long, device=device)
        return _result_ref(start, _next_token_ref(target[:, 0], target[:, 0], exponentials), draft, depth)
    present = draft.parents[:, 1:] >= 0
    tokens = torch.where(present, draft.tokens, torch.zeros_like(draft.tokens))
    p_x = target[:, :nodes].gather(2, tokens[..., None])[..., 0]
    q_x = torch.ones_like(p_x) if one_hot else draft.draft_probs.double().gather(2, tokens[..., None])[..., 0]
    accepted = present & (q_x > 0) & (uniforms.double() * q_x < p_x)
    positions = torch.arange(nodes, device=device)
    num_accepted = torch.where(accepted, nodes, positions).amin(-1)
    rejected = num_accepted < present.sum(-1)
    p = target[rows, num_accepted]
    at = num_accepted.clamp(max=nodes - 1)
    if one_hot:
        lanes = torch.arange(vocab, device=device)
        residual = torch.where(lanes[None] == tokens[rows, at][:, None], torch.zeros_like(p), p)
    else:
        residual = (p - draft.draft_probs[rows, at].double()).clamp_min(0.0)
    residual = torch.where(rejected[:, None], residual, p)
    return _result_ref(num_accepted, _next_token_ref(residual, p, exponentials), draft, depth)


@jit
def _chain_race_kernel(target_ptr, draft_ptr, tokens_ptr, parents_ptr, uniforms_ptr, exps_ptr,
                       score_ptr, index_ptr, current_ptr, nodes, vocab, chunk, num_chunks,
                       stride_tb, stride_tn, stride_tv, stride_qb, stride_qn, stride_qv, stride_xb, stride_xn,
                       stride_pb, stride_pn, stride_ub, stride_un, stride_eb, stride_ev,
                       ONE_HOT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):
    """Per (row, vocabulary chunk): the accepted count ``n`` (recomputed, cheap) and the race partials."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    k = tl.arange(0, BLOCK_N)
    live = k < nodes
    present = (tl.load(parents_ptr + row * stride_pb + (k + 1) * stride_pn, mask=live, other=-1) >= 0) & live
    raw = tl.load(tokens_ptr + row * stride_xb + k * stride_xn, mask=present, other=0)
    tokens = tl.where(present, raw, 0)
    safe = tl.minimum(tl.maximum(tokens, 0), vocab - 1)  # memory safety only: valid drafts lie in [0, V)
    p_x = tl.load(target_ptr + row * stride_tb + k * stride_tn + safe * stride_tv, mask=present, other=0).to(tl.float64)
    if ONE_HOT:
        q_x = tl.where(present, 1.0, 0.0).to(tl.float64)
    else:
        q_x = tl.load(draft_ptr + row * stride_qb + k * stride_qn + safe * stride_qv, mask=present, other=0)
        q_x = q_x.to(tl.float64)
    u = tl.load(uniforms_ptr + row * stride_ub + k * stride_un, mask=live, other=1).to(tl.float64)
    accepted = present & (q_x > 0) & (u * q_x < p_x)
    n = tl.min(tl.where(accepted, nodes, k), 0)
    rejected = n < tl.sum(present.to(tl.int32), 0)
    at = tl.maximum(tl.minimum(n, nodes - 1), 0)
    x_at = tl.sum(tl.where(k == at, tokens, 0), 0)
    if c == 0:
        tl.store(current_ptr + row, n.to(tl.int64))

    p_row = target_ptr + row * stride_tb + n * stride_tn
    q_row = draft_ptr + row * stride_qb + at * stride_qn
    lo, hi, best_r, index_r, best_p, index_p = _race_start(c, chunk, vocab)
    for start in range(lo, hi, BLOCK_V):
        lanes = start + tl.arange(0, BLOCK_V)
        inside = lanes < hi
        p = tl.load(p_row + lanes * stride_tv, mask=inside, other=0).to(tl.float64)
        exps = tl.load(exps_ptr + row * stride_eb + lanes * stride_ev, mask=inside, other=1).to(tl.float64)
        if ONE_HOT:
            residual = tl.where(lanes == x_at, 0.0, p)
        else:
            q = tl.load(q_row + lanes * stride_qv, mask=tl.where(rejected, inside, False), other=0).to(tl.float64)
            residual = tl.maximum(p - q, 0.0)
        residual = tl.where(rejected, residual, p)
        best_r, index_r = _race_tile(residual, exps, inside, best_r, index_r, start)
        best_p, index_p = _race_tile(p, exps, inside, best_p, index_p, start)
    _store_partials(score_ptr, index_ptr, (row * num_chunks + c) * 2, best_r, index_r, best_p, index_p)


def _launch_finish(scores, indices, current, draft, depth, num_chunks):
    batch = current.shape[0]
    device = current.device
    path = torch.empty(batch, depth + 1, dtype=torch.long, device=device)
    num_accepted = torch.empty(batch, dtype=torch.long, device=device)
    next_tokens = torch.empty(batch, dtype=torch.long, device=device)
    parents, depths = draft.parents.long(), draft.depths.long()
    _race_finish_kernel[(batch,)](
        scores, indices, current, next_tokens, path, num_accepted, parents, depths,
        num_chunks, depth + 1, *parents.stride(), *depths.stride(), BLOCK_D=next_pow2(depth + 1), **pdl_launch(),
    )
    return VerifyResult(path, num_accepted, next_tokens)


def _verify_chain_noise_triton(target_probs, draft, uniforms, exponentials, max_depth) -> VerifyResult:
    one_hot, batch, nodes, vocab = _chain_inputs("verify_chain_noise", target_probs, draft, uniforms, exponentials)
    depth = _depth(draft, max_depth)
    device = target_probs.device
    if batch == 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return VerifyResult(empty.reshape(0, depth + 1), empty, empty)
    chunk, num_chunks = _chunks(batch, vocab, _BLOCK_V)
    scores = torch.empty(batch, num_chunks, 2, dtype=torch.float64, device=device)
    indices = torch.empty(batch, num_chunks, 2, dtype=torch.int32, device=device)
    current = torch.empty(batch, dtype=torch.long, device=device)
    draft_probs = target_probs if one_hot or nodes == 0 else draft.draft_probs
    tokens = draft.tokens.long() if nodes else draft.parents.long()  # a dummy pointer when there are no drafts
    parents = draft.parents.long()
    noise_u = uniforms if nodes else exponentials
    _chain_race_kernel[(batch, num_chunks)](
        target_probs, draft_probs, tokens, parents, noise_u, exponentials, scores, indices, current,
        nodes, vocab, chunk, num_chunks, *target_probs.stride(), *draft_probs.stride(), *tokens.stride(),
        *parents.stride(), *noise_u.stride(), *exponentials.stride(),
        ONE_HOT=one_hot, BLOCK_N=next_pow2(nodes), BLOCK_V=_BLOCK_V, **pdl_launch(),
    )
    return _launch_finish(scores, indices, current, draft, depth, num_chunks)


def verify_chain_noise(
    target_probs: torch.Tensor,
    draft: Draft,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Speculative sampling of draft chains under pre-drawn noise (two launches, no host sync).

    Math (position ``k = 0..K_b - 1`` is node ``k + 1``, ``p_k = target_probs[:, k]``, ``q_k`` the draft's
    distribution, one-hot at ``x_k`` for ``DETERMINISTIC`` drafts)::

        accepted_k  = q_k(x_k) > 0  and  u_k * q_k(x_k) < p_k(x_k)          (probability min(1, p/q))
        n           = first k not accepted  (K_b when all are)
        w           = max(p_n - q_n, 0) if n < K_b else p_n                  (residual, or target for the bonus)
        next token  = argmax_v  w_v / E_v   over w_v > 0                       (exponential race: law w / sum w)

    The race never normalises ``w`` and scores lanes with ``w_v = 0`` (and lanes past ``V``) at ``-inf``, so they
    never win; a residual without mass falls back to ``p_n``. Lossless for chains of every scheme (the
    Monte-Carlo test in ``tests/test_kernels_verify.py`` checks the law, and that resampling from ``p`` instead of
    the residual fails it).

    Dispatch: the kernels when the tensors are on CUDA and triton imports, :func:`verify_chain_noise_ref`
    otherwise; both give identical integers under the same noise.

    Args:
        target_probs: processed target distributions (``[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: a chain per row: node ``i``'s parent is ``i - 1`` for its ``K_b`` present nodes, absent nodes
            (parent -1) after them; ``draft_probs`` for sampled schemes.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs ``[B, N, V]``.
        uniforms: ``U[0, 1)`` noise, column ``k`` for node ``k + 1``.
            Shape: ``[B, N]`` (float64 preferred).
        exponentials: ``Exp(1)`` noise of the next token's race.
            Shape: ``[B, V]`` (float64 preferred).
        max_depth: ``D`` (the longest chain); ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult`.

    Example:
        >>> probs = torch.tensor([[[0.5, 0.5], [0.2, 0.8]]], dtype=torch.float64)
        >>> draft = Draft(torch.tensor([[1]]), torch.tensor([[-1, 0]]), torch.tensor([[0, 1]]), None,
        ...               DraftScheme.DETERMINISTIC)
        >>> noise = draw_verify_noise(torch.Generator().manual_seed(0), 1, 1, 2, "cpu")
        >>> verify_chain_noise(probs, draft, *noise).num_accepted.shape
        torch.Size([1])

    References:
        Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318; vLLM ``rejection_random_sample_kernel``
        and ``sample_recovered_tokens_kernel``; FlashInfer ``chain_speculative_sampling``.
    """
    tensors = [target_probs, draft.tokens, draft.parents, uniforms, exponentials]
    if use_kernel("verify_chain_noise", *tensors):
        return _verify_chain_noise_triton(target_probs, draft, uniforms, exponentials, max_depth)
    return verify_chain_noise_ref(target_probs, draft, uniforms, exponentials, max_depth=max_depth)


# ----------------------------------------------------------------------------------------------------------------
# Target-only tree rejection sampling (deterministic drafts) under pre-drawn noise
# ----------------------------------------------------------------------------------------------------------------


def _tree_inputs(name, target_probs, draft, uniforms, exponentials):
    if draft.scheme != DraftScheme.DETERMINISTIC:
        raise ValueError(
            f"{name} is exact for DETERMINISTIC drafts only, got a {draft.scheme.name} draft: use "
            "specdec.verify.select_verifier(draft.scheme, params) for sampled trees"
        )
    batch, nodes, vocab = _verify._check_inputs(target_probs, draft, False, name)
    _check_noise(name, uniforms, exponentials, batch, nodes, vocab)
    return batch, nodes, vocab


def verify_tree_deterministic_noise_ref(
    target_probs: torch.Tensor,
    draft: Draft,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Reference for :func:`verify_tree_deterministic_noise` (same signature and result): torch, float64, one
    step per node, vectorised over rows.

    Args:
        target_probs: Shape ``[B, N + 1, V]``, processed target distributions.
        draft: a ``DETERMINISTIC`` draft tree (tokens ``[B, N]``, parents and depths ``[B, N + 1]``).
        uniforms: Shape ``[B, N]``, ``U[0, 1)`` noise (node ``i`` uses column ``i - 1``).
        exponentials: Shape ``[B, V]``, ``Exp(1)`` noise.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult`.
    """
    batch, nodes, vocab = _tree_inputs("verify_tree_deterministic_noise", target_probs, draft, uniforms, exponentials)
    depth = _depth(draft, max_depth)
    device = target_probs.device
    rows = torch.arange(batch, device=device)
    target = target_probs.double()
    parents = draft.parents.long()
    present = (parents >= 0) & (torch.arange(nodes + 1, device=device) > 0)
    tokens = torch.cat([torch.full_like(parents[:, :1], -1), torch.where(present[:, 1:], draft.tokens, 0)], 1)
    p_x = target.gather(1, parents.clamp_min(0)[..., None].expand(-1, -1, vocab)).gather(
        2, tokens.clamp_min(0)[..., None])[..., 0]
    p_x = torch.where(present, p_x, torch.zeros_like(p_x))
    u = uniforms.double()
    current = torch.zeros(batch, dtype=torch.long, device=device)
    removed = torch.zeros(batch, dtype=torch.float64, device=device)
    rejected = torch.zeros(batch, nodes + 1, dtype=torch.bool, device=device)
    ids = torch.arange(nodes + 1, device=device)
    for i in range(1, nodes + 1):
        tries = parents[:, i] == current
        repeat = (rejected & (tokens == tokens[:, i : i + 1])).any(-1)
        accept = tries & ~repeat & (u[:, i - 1] * (1.0 - removed) < p_x[:, i])
        reject = tries & ~accept
        current = torch.where(accept, i, current)
        removed = torch.where(accept, 0.0, torch.where(reject & ~repeat, removed + p_x[:, i], removed))
        rejected = torch.where(accept[:, None], False, rejected | ((ids == i)[None] & reject[:, None]))
    p = target[rows, current]
    children = present & (parents == current[:, None])
    # Zero the (all rejected) children's tokens of the last accepted node; other nodes scatter to a spare column.
    residual = torch.cat([p, torch.zeros_like(p[:, :1])], 1)
    residual.scatter_(1, torch.where(children, tokens, vocab), 0.0)
    residual = residual[:, :vocab]
    return _result_ref(current, _next_token_ref(residual, p, exponentials.double()), draft, depth)


@jit
def _tree_race_kernel(target_ptr, tokens_ptr, parents_ptr, uniforms_ptr, exps_ptr, score_ptr, index_ptr, current_ptr,
                      nodes, vocab, chunk, num_chunks,
                      stride_tb, stride_tn, stride_tv, stride_xb, stride_xn, stride_pb, stride_pn,
                      stride_ub, stride_un, stride_eb, stride_ev,
                      BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):
    """Per (row, vocabulary chunk): the tree walk (recomputed, in registers) and the race partials."""
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    ids = tl.arange(0, BLOCK_N)
    live = ids < nodes + 1
    parents = tl.load(parents_ptr + row * stride_pb + ids * stride_pn, mask=live, other=-1)
    present = (parents >= 0) & (ids > 0) & live
    raw = tl.load(tokens_ptr + row * stride_xb + (ids - 1) * stride_xn, mask=present, other=0)
    tokens = tl.where(present, raw, -1)
    safe = tl.minimum(tl.maximum(tokens, 0), vocab - 1)  # memory safety only: valid drafts lie in [0, V)
    p_x = tl.load(target_ptr + row * stride_tb + tl.maximum(parents, 0) * stride_tn + safe * stride_tv, mask=present,
                  other=0).to(tl.float64)
    u = tl.load(uniforms_ptr + row * stride_ub + (ids - 1) * stride_un, mask=present, other=1).to(tl.float64)

    current = (row * 0).to(tl.int64)
    removed = (row * 0).to(tl.float64)
    rejected = ids < 0
    for i in range(1, nodes + 1):
        this = ids == i
        tries = tl.sum(tl.where(this, parents, 0), 0) == current
        token = tl.sum(tl.where(this, tokens, 0), 0)
        p_i = tl.sum(tl.where(this, p_x, 0.0), 0)
        u_i = tl.sum(tl.where(this, u, 0.0), 0)
        repeat = tl.max((rejected & (tokens == token)).to(tl.int32), 0) > 0
        accept = tries & ~repeat & (u_i * (1.0 - removed) < p_i)
        reject = tries & ~accept
        current = tl.where(accept, i, current)
        removed = tl.where(accept, 0.0, tl.where(reject & ~repeat, removed + p_i, removed))
        rejected = tl.where(accept, ids < 0, rejected | (this & reject))
    if c == 0:
        tl.store(current_ptr + row, current)

    # The last accepted node's children (all rejected) leave the residual. Their tokens are packed into groups of
    # BLOCK_C (rank = prefix count), so a tile is compared with BLOCK_C tokens, not with every node: one group for
    # trees with at most BLOCK_C children per node, as EAGLE-2's top-k trees.
    children = (present & (parents == current)).to(tl.int32)
    rank = tl.cumsum(children, 0) - 1
    num_children = tl.sum(children, 0)
    group = tl.arange(0, BLOCK_C)
    p_row = target_ptr + row * stride_tb + current * stride_tn
    lo, hi, best_r, index_r, best_p, index_p = _race_start(c, chunk, vocab)
    for start in range(lo, hi, BLOCK_V):
        lanes = start + tl.arange(0, BLOCK_V)
        inside = lanes < hi
        p = tl.load(p_row + lanes * stride_tv, mask=inside, other=0).to(tl.float64)
        exps = tl.load(exps_ptr + row * stride_eb + lanes * stride_ev, mask=inside, other=1).to(tl.float64)
        excluded = lanes < 0
        for first in range(0, num_children, BLOCK_C):
            pick = (rank[None, :] == first + group[:, None]) & (children[None, :] > 0)
            kids = tl.max(tl.where(pick, tokens[None, :], -1), 1)
            excluded = excluded | (tl.max((lanes[:, None] == kids[None, :]).to(tl.int32), 1) > 0)
        residual = tl.where(excluded, 0.0, p)
        best_r, index_r = _race_tile(residual, exps, inside, best_r, index_r, start)
        best_p, index_p = _race_tile(p, exps, inside, best_p, index_p, start)
    _store_partials(score_ptr, index_ptr, (row * num_chunks + c) * 2, best_r, index_r, best_p, index_p)


def _verify_tree_deterministic_noise_triton(target_probs, draft, uniforms, exponentials, max_depth) -> VerifyResult:
    batch, nodes, vocab = _tree_inputs("verify_tree_deterministic_noise", target_probs, draft, uniforms, exponentials)
    depth = _depth(draft, max_depth)
    device = target_probs.device
    if batch == 0:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return VerifyResult(empty.reshape(0, depth + 1), empty, empty)
    block_n = next_pow2(nodes + 1)
    block_c = min(block_n, 16)
    # The children exclusion compares a [block_v, block_c] tile: 4096 elements (32 per thread) keeps the kernel
    # under ~170 registers on sm_90, with no spills.
    block_v = min(_BLOCK_V, 4096 // block_c) if not INTERPRETED else _BLOCK_V
    chunk, num_chunks = _chunks(batch, vocab, block_v)
    scores = torch.empty(batch, num_chunks, 2, dtype=torch.float64, device=device)
    indices = torch.empty(batch, num_chunks, 2, dtype=torch.int32, device=device)
    current = torch.empty(batch, dtype=torch.long, device=device)
    parents = draft.parents.long()
    tokens = draft.tokens.long() if nodes else parents
    noise_u = uniforms if nodes else exponentials
    _tree_race_kernel[(batch, num_chunks)](
        target_probs, tokens, parents, noise_u, exponentials, scores, indices, current,
        nodes, vocab, chunk, num_chunks, *target_probs.stride(), *tokens.stride(), *parents.stride(),
        *noise_u.stride(), *exponentials.stride(), BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_V=block_v, **pdl_launch(),
    )
    return _launch_finish(scores, indices, current, draft, depth, num_chunks)


def verify_tree_deterministic_noise(
    target_probs: torch.Tensor,
    draft: Draft,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Target-only recursive rejection of a tree of deterministic drafts under pre-drawn noise (two launches).

    Math (nodes in index order; ``p`` the target at the current node, ``m`` the mass of its children rejected
    so far)::

        child i of the current node:  accepted iff  u_i * (1 - m) < p(x_i)      (probability p(x_i) / (1 - m))
                                      a token already rejected here is rejected again
        accepted:  descend (m = 0);   rejected:  m += p(x_i)
        next token = argmax_v w_v / E_v,  w = p at the last accepted node with its children's tokens removed

    This is "draw ``x ~ p``; descend if ``x`` is a child, else emit ``x``", step by step, so the emitted tokens
    follow the target exactly (EAGLE-2's ``evaluate_posterior``; the law test in
    ``tests/test_kernels_verify.py`` checks it). The same law as :func:`specdec.verify.verify_tree_deterministic`,
    which normalises the residual vector after each rejection instead.

    Dispatch: the kernels when the tensors are on CUDA and triton imports,
    :func:`verify_tree_deterministic_noise_ref` otherwise; identical integers under the same noise.

    Args:
        target_probs: processed target distributions (``[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: a ``DETERMINISTIC`` draft tree (``draft_probs`` ignored).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        uniforms: ``U[0, 1)`` noise, column ``i - 1`` for node ``i``.
            Shape: ``[B, N]`` (float64 preferred).
        exponentials: ``Exp(1)`` noise of the next token's race.
            Shape: ``[B, V]`` (float64 preferred).
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`~specdec.types.VerifyResult`.

    References:
        Li et al., "EAGLE-2", arXiv 2406.16858 (``evaluate_posterior``); SGLang
        ``tree_speculative_sampling_target_only`` with both thresholds 1.
    """
    tensors = [target_probs, draft.tokens, draft.parents, uniforms, exponentials]
    if use_kernel("verify_tree_deterministic_noise", *tensors):
        return _verify_tree_deterministic_noise_triton(target_probs, draft, uniforms, exponentials, max_depth)
    return verify_tree_deterministic_noise_ref(target_probs, draft, uniforms, exponentials, max_depth=max_depth)


for _fn, _exact in ((verify_chain_noise, _verify.verify_chain.exact_for),
                    (verify_chain_noise_ref, _verify.verify_chain.exact_for),
                    (verify_tree_deterministic_noise, frozenset({DraftScheme.DETERMINISTIC})),
                    (verify_tree_deterministic_noise_ref, frozenset({DraftScheme.DETERMINISTIC}))):
    _fn.lossless, _fn.exact_for = True, _exact
