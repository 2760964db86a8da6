"""Verification: decide which draft tokens the target accepts, and the token that follows them.

Every verifier (built-in or yours) is called one way, the :class:`Verifier` protocol; it is batched over rows
and returns a :class:`~specdec.types.VerifyResult`::

    verifier(target_probs [B, N+1, V], draft, source, max_depth=D) -> VerifyResult

``target_probs[:, i]`` is the target's distribution of the token that follows node ``i`` (node 0 is the root),
already processed by :func:`specdec.sampling.process_logits` with the run's :class:`SamplingParams`; a verifier
marked ``takes_logits`` (:func:`verify_greedy`: it only takes the argmax) gets the raw logits instead
(:func:`verifier_input` says which). ``source`` is always a :class:`~specdec.sampling.RandomSource` (a
placeholder that refuses to draw when greedy); ``max_depth`` bounds the draft's depth, so no verifier has to
read it from the device.

A lossless verifier is exact only for the way the drafts were made (``Draft.scheme``); each verifier carries
``lossless`` and ``exact_for`` attributes, and :func:`select_verifier` picks the right one:

=============================== =============================================== ===============================
verifier                        exact for                                       algorithm
=============================== =============================================== ===============================
``verify_greedy``               every scheme, temperature 0                     argmax matching
``verify_chain``                chains of any scheme                            Leviathan / Chen rejection
``verify_tree_deterministic``   ``DETERMINISTIC`` (top-k, n-gram, argmax)       target-only recursive rejection
``verify_tree_iid``             ``IID`` (children sampled i.i.d. from q)        SpecInfer multi-step sampling
``verify_tree_without_replacement`` ``WITHOUT_REPLACEMENT``                     recursive rejection (RSD)
``verify_typical``              none: **not lossless**                          Medusa typical acceptance
=============================== =============================================== ===============================

Tree walk shared by the stochastic tree verifiers (glossary: *accepted*, *recovered*, *bonus*): start at the root
with ``p = target_probs[:, 0]``; try the current node's children in index (rank) order; a child ``x`` tested
against proposal ``q_j`` is accepted w.p. ``min(1, p(x) / q_j(x))`` (rejected when ``q_j(x) == 0``); on acceptance
descend to it with a fresh ``p``; on rejection ``p <- norm(max(p - q_j, 0))``; when no child is left, sample the
next token from ``p`` (the *bonus* token if nothing was rejected at that node, else the *recovered* token). The
verifiers differ only in ``q_j``: one-hot at ``x`` (deterministic), the fixed ``q`` (i.i.d.), or ``q`` with the
earlier siblings removed and renormalised (without replacement).

Host syncs: none, except reading the draft's depth when ``max_depth`` is not given (pass the compiled tree's depth).
Token ids at present nodes are checked against ``V`` when the tensors are on the CPU (free there); on an
accelerator that check would cost a sync, so it is left to :func:`check_draft` and to :func:`specdec.step.step`,
which checks every draft without one.
"""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from .sampling import RandomSource, as_source, process_logits
from .trees import ancestor_matrix
from .types import Draft, DraftScheme, SamplingParams, VerifyResult

__all__ = [
    "verify_greedy",
    "verify_chain",
    "verify_tree_deterministic",
    "verify_tree_iid",
    "verify_tree_without_replacement",
    "verify_typical",
    "select_verifier",
    "emitted_tokens",
    "check_draft",
    "Verifier",
    "as_verifier",
    "verifier_input",
]

_ALL_SCHEMES = frozenset(DraftScheme)


@runtime_checkable
class Verifier(Protocol):
    """The one calling convention of every verifier, built-in or user-supplied.

    A verifier may also carry the attributes the built-in ones have: ``lossless`` (bool), ``exact_for`` (the
    :class:`~specdec.types.DraftScheme` values it is exact for) and ``takes_logits`` (it only needs the argmax,
    so it is fed raw logits; default ``False``: processed probabilities). See :func:`verifier_input`.
    """

    def __call__(self, target_probs: torch.Tensor, draft: Draft, source: RandomSource, *,
                 max_depth: int | None = None) -> VerifyResult:
        """Decide the accepted path and the next token of every row.

        Args:
            target_probs: the target's distributions at every node (``[:, i]``: the token after node ``i``),
                processed by :func:`~specdec.sampling.process_logits`; raw logits for ``takes_logits`` verifiers.
                Shape: ``[B, N + 1, V]``.
            draft: the draft tree.
                Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
            source: where the verifier's randomness comes from.
            max_depth: ``D``, a bound of the draft's depth (``None``: read it from the draft, one host sync).

        Returns:
            :class:`~specdec.types.VerifyResult`.
        """
        ...


def _verifier(*, lossless: bool, exact_for: frozenset[DraftScheme],
              takes_logits: bool = False) -> Callable[[Verifier], Verifier]:
    def mark(fn: Verifier) -> Verifier:
        fn.lossless = lossless
        fn.exact_for = frozenset(exact_for)
        fn.takes_logits = takes_logits
        return fn

    return mark


def as_verifier(fn: Callable[..., VerifyResult]) -> Verifier:
    """Normalise a verifier function into the :class:`Verifier` convention (as ``as_source`` does randomness).

    A function that takes ``max_depth`` (or ``**kwargs``) is returned as is. One written for the earlier
    conventions, ``fn(target_probs, draft, source)`` or ``fn(target_probs, draft)`` (greedy overrides), is
    wrapped so that it is called the one way; ``max_depth`` is then dropped (such a function reads the depth
    itself) and its ``lossless`` / ``exact_for`` / ``takes_logits`` attributes are kept.

    Args:
        fn: the verifier function.

    Returns:
        A :class:`Verifier`.

    Raises:
        TypeError: ``fn`` is not callable, or takes neither 2 nor 3 positional arguments.

    Example:
        >>> v = as_verifier(lambda target_probs, draft, source: verify_greedy(target_probs, draft))
        >>> sorted(inspect.signature(v).parameters)
        ['draft', 'max_depth', 'source', 'target_probs']
    """
    if not callable(fn):
        raise TypeError(f"a verifier must be callable as verifier(target_probs, draft, source, max_depth=D), got a "
                        f"{type(fn).__name__}")
    try:
        return _as_verifier_cached(fn)  # once per function: generate() normalises its verifier every step
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _as_verifier(fn)


def _as_verifier(fn: Callable[..., VerifyResult]) -> Verifier:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin, some C callables): trust the caller
        return fn
    if any(p.name == "max_depth" or p.kind is p.VAR_KEYWORD for p in params):
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        positional = [None] * 3
    if len(positional) not in (2, 3):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} takes {len(positional)} positional arguments; a verifier "
                        f"is called as verifier(target_probs, draft, source, *, max_depth=D) (specdec.verify.Verifier)")
    takes_source = len(positional) == 3

    def verifier(target_probs, draft, source, *, max_depth=None):
        return fn(target_probs, draft, source) if takes_source else fn(target_probs, draft)

    for name in ("lossless", "exact_for", "takes_logits", "__name__", "__doc__"):
        if hasattr(fn, name):
            setattr(verifier, name, getattr(fn, name))
    return verifier


_as_verifier_cached = functools.lru_cache(maxsize=64)(_as_verifier)


def verifier_input(verifier: Verifier, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """What ``verifier`` is fed: raw logits if it is marked ``takes_logits``, else the processed probabilities.

    Math: ``process_logits(logits, params)`` (temperature, top-k, top-p; one-hot argmax when greedy), or
    ``logits`` untouched for a verifier that only takes the argmax (no copy, any dtype).

    Args:
        verifier: the verifier about to be called.
        logits: the target's logits at every node.
            Shape: ``[B, N + 1, V]``.
        params: the run's sampling parameters.

    Returns:
        Shape ``[B, N + 1, V]``: logits, or float32 probabilities (float64 for float64 logits).

    References:
        :class:`Verifier` (the one calling convention of every verifier).
    """
    if getattr(verifier, "takes_logits", False):
        return logits
    return process_logits(logits, params)


# ----------------------------------------------------------------------------------------------------------------
# Input checks (shapes only: no host sync) and tree helpers
# ----------------------------------------------------------------------------------------------------------------


def _check_inputs(target_probs: torch.Tensor, draft: Draft, need_draft_probs: bool, name: str) -> tuple[int, int, int]:
    if not isinstance(draft, Draft):
        raise TypeError(f"{name}: draft must be a specdec.Draft, got {type(draft).__name__}")
    if target_probs.dim() != 3:
        raise ValueError(
            f"{name}: target_probs must have shape [B, N + 1, V], got {tuple(target_probs.shape)}; "
            "add the batch dimension with target_probs[None] for a single row"
        )
    if draft.tokens.dim() != 2:
        raise ValueError(f"{name}: draft.tokens must have shape [B, N], got {tuple(draft.tokens.shape)}")
    batch, nodes = draft.tokens.shape
    vocab = target_probs.shape[-1]
    if tuple(target_probs.shape[:2]) != (batch, nodes + 1):
        raise ValueError(
            f"{name}: target_probs has shape {tuple(target_probs.shape)} but the draft has B={batch} rows and "
            f"N={nodes} draft nodes: target_probs needs [B, N + 1, V] = [{batch}, {nodes + 1}, V] (root included)"
        )
    for field in ("parents", "depths"):
        shape = tuple(getattr(draft, field).shape)
        if shape != (batch, nodes + 1):
            raise ValueError(f"{name}: draft.{field} must have shape [B, N + 1] = [{batch}, {nodes + 1}], got {shape}")
    if need_draft_probs:
        if draft.draft_probs is None:
            raise ValueError(
                f"{name}: a {draft.scheme.value} draft needs draft.draft_probs (the distributions the drafts were "
                "sampled from); deterministic drafts should say scheme=DraftScheme.DETERMINISTIC"
            )
        shape = tuple(draft.draft_probs.shape)
        if shape[:2] != (batch, nodes) or len(shape) != 3:
            raise ValueError(
                f"{name}: draft.draft_probs must have shape [B, N, V] = [{batch}, {nodes}, V], got {shape}"
            )
        if shape[2] != vocab:
            raise ValueError(
                f"{name}: draft_probs has vocabulary {shape[2]} but target_probs has {vocab}: draft and target must "
                "share one vocabulary (map a reduced draft vocabulary to the target's, e.g. with d2t, first)"
            )
    if nodes and draft.tokens.device.type == "cpu":  # free on the CPU; elsewhere it would cost a host sync
        _check_token_ids(draft, vocab, name)
    return batch, nodes, vocab


def _check_token_ids(draft: Draft, vocab: int, name: str) -> None:
    """Raise a named error for a token id outside ``[0, V)`` at a present node (reads the tensors)."""
    bad = (draft.parents[:, 1:] >= 0) & ((draft.tokens < 0) | (draft.tokens >= vocab))
    if bool(bad.any()):
        row, node = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name}: row {row}, node {node + 1} holds token id {int(draft.tokens[row, node])}, outside the "
            f"vocabulary [0, {vocab}): a present node needs a real token id (mark padding nodes absent with "
            "parent -1 and depth 0)"
        )


def _check_scheme(fn_name: str, draft: Draft, exact_for: frozenset[DraftScheme]) -> None:
    if draft.scheme not in exact_for:
        names = ", ".join(sorted(s.name for s in exact_for))
        raise ValueError(
            f"{fn_name} is exact for {names} drafts only, got a {draft.scheme.name} draft: verifying drafts with a "
            "rule made for another drafting scheme biases the output; use select_verifier(draft.scheme, params)"
        )


def _depth(draft: Draft, max_depth: int | None) -> int:
    # Reading the depth from the tensor is the one host sync of a verifier; a compiled tree knows it statically.
    return draft.max_depth if max_depth is None else int(max_depth)


def _work_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _safe_parents(parents: torch.Tensor) -> torch.Tensor:
    # The root (and absent nodes) point at the root, which makes the root a fixed point of the ancestor map.
    return parents.clamp_min(0)


def _and_over_path(flags: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """AND of ``flags`` over each node and all its ancestors (pointer doubling, ``ceil(log2(N + 1))`` steps).

    Needs ``flags[:, 0] == True`` (the root is the identity of the reduction).
    """
    ancestor = _safe_parents(parents)
    for _ in range((parents.shape[1] - 1).bit_length()):
        flags = flags & flags.gather(1, ancestor)
        ancestor = ancestor.gather(1, ancestor)
    return flags


def _sum_over_path(values: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over each node and all its ancestors; needs ``values[:, 0] == 0``."""
    ancestor = _safe_parents(parents)
    for _ in range((parents.shape[1] - 1).bit_length()):
        values = values + values.gather(1, ancestor)
        ancestor = ancestor.gather(1, ancestor)
    return values


def _path_to(node: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Root-to-``node`` path per row, shape ``[B, max_depth + 1]``, padded with -1.

    The path's nodes are ``node``'s row of the ancestor matrix (pointer doubling: ``ceil(log2 N)`` rounds, no
    loop over depth); each is written at the column of its depth (depths on a path are distinct).
    """
    batch, width = parents.shape
    on_path = ancestor_matrix(parents).gather(1, node[:, None, None].expand(batch, 1, width))[:, 0]
    spill = max_depth + 1  # nodes off the path land in a column that is cut off
    column = torch.where(on_path & (depths <= max_depth), depths, torch.full_like(depths, spill))
    index = torch.arange(width, device=node.device).expand(batch, width)
    path = torch.full((batch, max_depth + 2), -1, dtype=torch.long, device=node.device)
    # Off-path nodes all land in the spill column (which one wins there does not matter).
    path.scatter_(1, column, torch.where(on_path, index, torch.full_like(index, -1)))
    return path[:, : max_depth + 1]


def _result(node: torch.Tensor, next_tokens: torch.Tensor, draft: Draft, max_depth: int) -> VerifyResult:
    num_accepted = draft.depths.gather(1, node[:, None])[:, 0]
    path = _path_to(node, draft.parents, draft.depths, max_depth)
    return VerifyResult(accepted_nodes=path, num_accepted=num_accepted, next_tokens=next_tokens)


def _at_node(values: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``values[b, node[b]]`` for ``values`` of shape ``[B, M, V]`` -> ``[B, V]``."""
    return values.gather(1, node[:, None, None].expand(-1, 1, values.shape[-1]))[:, 0]


def _normalised_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))``; where that has no mass (rejection had probability 0), ``p`` itself."""
    residual = (p - q).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


# ----------------------------------------------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------------------------------------------


@_verifier(lossless=True, exact_for=_ALL_SCHEMES, takes_logits=True)
def verify_greedy(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator | None = None,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Greedy (temperature 0) verification of a tree or chain: accept drafts equal to the target's argmax.

    Math: with ``a_i = argmax_v target[i, v]`` (ties to the lowest id), node ``i`` is accepted iff
    ``token_i == a_parent(i)`` and its parent is accepted (the root always is). The chosen node ``n*`` is the
    deepest accepted node (ties: smallest index) and the next token is ``a_{n*}``. The emitted tokens are then
    exactly the first ``depth(n*) + 1`` tokens of plain greedy decoding. Fully vectorised: the ancestor AND is
    computed by pointer doubling (``ceil(log2(N + 1))`` gathers), no loop over rows or nodes, no host sync
    when ``max_depth`` is given.

    Args:
        target_probs: target logits or probabilities at every node (only the argmax is used, so raw logits work
            and any dtype is fine).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree (any scheme; ``draft_probs`` is ignored).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        source: ignored (greedy draws nothing); accepted so that every verifier has one signature
            (:class:`Verifier`). The verifier is marked ``takes_logits``: callers may pass raw logits.
        max_depth: ``D``, the tree's depth bound; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult` with ``accepted_nodes`` ``[B, D + 1]``, ``num_accepted`` ``[B]``,
        ``next_tokens`` ``[B]``.

    References:
        Cai et al., "Medusa", arXiv 2401.10774 (tree greedy acceptance); Li et al., "EAGLE-2",
        arXiv 2406.16858; SGLang ``verify_tree_greedy``.
    """
    _check_inputs(target_probs, draft, False, "verify_greedy")
    depth = _depth(draft, max_depth)
    batch, nodes = draft.tokens.shape
    if nodes == 0:  # a plain step: the root's argmax (the path below gives the same, in ~10x more kernels)
        path = torch.full((batch, depth + 1), -1, dtype=torch.long, device=target_probs.device)
        path[:, 0] = 0
        return VerifyResult(accepted_nodes=path, num_accepted=path[:, 0] * 0, next_tokens=target_probs[:, 0].argmax(-1))
    argmax = target_probs.argmax(-1)
    parents = _safe_parents(draft.parents)
    matches = (draft.parents[:, 1:] >= 0) & (draft.tokens == argmax.gather(1, parents[:, 1:]))
    root = torch.ones(batch, 1, dtype=torch.bool, device=matches.device)
    accepted = _and_over_path(torch.cat([root, matches], dim=1), draft.parents)
    score = torch.where(accepted, draft.depths, torch.full_like(draft.depths, -1))
    best = score.argmax(-1)  # first maximum: the smallest index among the deepest accepted nodes
    return _result(best, argmax.gather(1, best[:, None])[:, 0], draft, depth)


# ----------------------------------------------------------------------------------------------------------------
# Chain rejection sampling
# ----------------------------------------------------------------------------------------------------------------


@_verifier(lossless=True, exact_for=_ALL_SCHEMES)
def verify_chain(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Speculative sampling of a draft chain (Leviathan et al.; Chen et al.), vectorised over rows and positions.

    Math (position ``k = 1..K``, draft ``x_k`` drawn from ``q_k``, target ``p_k = target_probs[:, k - 1]``)::

        accept x_k  w.p. min(1, p_k(x_k) / q_k(x_k))     (0 when q_k(x_k) == 0)
        first rejection at k:  recovered ~ norm(max(p_k - q_k, 0))
        all K accepted:        bonus ~ p_{K+1} = target_probs[:, K]

    With ``draft.scheme == DETERMINISTIC`` (n-gram or argmax chains; ``draft_probs`` is then ignored) ``q_k`` is
    one-hot at ``x_k``: accept w.p. ``p_k(x_k)``, recovered from ``p_k`` with ``x_k`` zeroed. Exact for chains of
    every scheme (a chain has one child per node, so ``IID`` and ``WITHOUT_REPLACEMENT`` coincide).

    Vectorised over rows and positions: with ``a_k`` the acceptance probabilities, the number of accepted drafts
    ``n`` (the first rejection under independent coins) has ``P(n = k) = a_1 ... a_k (1 - a_{k+1})`` (``a = 0``
    past the last draft), so it is drawn by one ``categorical`` over ``[B, N + 1]``; the next token by one
    ``categorical`` over ``[B, V]``. Rows with fewer drafts are padded with absent nodes at the end.

    Args:
        target_probs: processed target distributions (``target_probs[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: a chain per row: node ``i``'s parent is ``i - 1`` for its ``K_b`` present nodes, absent nodes
            (parent -1) after them (:func:`check_draft` with ``chain=True`` checks this).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs ``[B, N, V]`` (sampled schemes).
        source: a :class:`~specdec.sampling.RandomSource` or ``torch.Generator``.
        max_depth: ``D`` (here the longest chain); ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult`.

    References:
        Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", arXiv 2211.17192;
        Chen et al., "Accelerating LLM Decoding with Speculative Sampling", arXiv 2302.01318.
    """
    one_hot = draft.scheme == DraftScheme.DETERMINISTIC
    batch, nodes, vocab = _check_inputs(target_probs, draft, not one_hot, "verify_chain")
    depth = _depth(draft, max_depth)
    source = as_source(source)
    dtype = _work_dtype(target_probs, None if one_hot else draft.draft_probs)
    target = target_probs.to(dtype)
    device = target.device
    if nodes == 0:
        next_tokens = source.categorical(target[:, 0])
        return _result(torch.zeros(batch, dtype=torch.long, device=device), next_tokens, draft, depth)

    present = draft.parents[:, 1:] >= 0
    tokens = torch.where(present, draft.tokens, torch.zeros_like(draft.tokens))
    p_x = target[:, :nodes].gather(2, tokens[..., None])[..., 0]
    if one_hot:
        q_x = torch.ones_like(p_x)
    else:
        draft_probs = draft.draft_probs.to(dtype)
        q_x = draft_probs.gather(2, tokens[..., None])[..., 0]
    ratio = (p_x / torch.where(q_x > 0, q_x, torch.ones_like(q_x))).clamp(max=1.0)
    accept_prob = torch.where(present & (q_x > 0), ratio, torch.zeros_like(ratio))
    # The number of accepted drafts is the index of the first rejection under independent coins a_k:
    # P(n = k) = a_1 ... a_k (1 - a_{k+1}), with a = 0 past the last draft. One categorical over K + 1 outcomes
    # draws it for all rows and positions at once.
    survive = torch.cat([torch.ones_like(accept_prob[:, :1]), accept_prob.cumprod(-1)], dim=1)
    stop = 1.0 - torch.cat([accept_prob, torch.zeros_like(accept_prob[:, :1])], dim=1)
    num_accepted = source.categorical(survive * stop)
    rejected = num_accepted < present.long().sum(-1)

    p = _at_node(target, num_accepted)
    position = num_accepted.clamp(max=nodes - 1)
    if one_hot:
        q = torch.nn.functional.one_hot(tokens.gather(1, position[:, None])[:, 0], vocab).to(dtype)
    else:
        q = _at_node(draft_probs, position)
    weights = torch.where(rejected[:, None], _normalised_residual(p, q), p)
    return _result(num_accepted, source.categorical(weights), draft, depth)


# ----------------------------------------------------------------------------------------------------------------
# Multi-draft tree rejection sampling
# ----------------------------------------------------------------------------------------------------------------


def _tree_rejection(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    max_depth: int | None,
    scheme: DraftScheme,
    name: str,
) -> VerifyResult:
    """The shared tree walk; ``scheme`` picks the proposal ``q_j`` each sibling is tested against."""
    batch, nodes, vocab = _check_inputs(target_probs, draft, scheme != DraftScheme.DETERMINISTIC, name)
    depth = _depth(draft, max_depth)
    source = as_source(source)
    dtype = _work_dtype(target_probs, None if scheme == DraftScheme.DETERMINISTIC else draft.draft_probs)
    target = target_probs.to(dtype)
    device = target.device

    deterministic = scheme == DraftScheme.DETERMINISTIC
    present = draft.parents[:, 1:] >= 0
    tokens = torch.where(present, draft.tokens, torch.zeros_like(draft.tokens))  # absent nodes may hold anything
    draft_probs = None if deterministic else draft.draft_probs.to(dtype)
    tiny = torch.finfo(dtype).tiny

    current = torch.zeros(batch, dtype=torch.long, device=device)  # last accepted node
    p = target[:, 0]  # residual target distribution at `current`, normalised
    removed = torch.zeros(batch, vocab, dtype=torch.bool, device=device)  # rejected siblings (without replacement)
    # Nodes come parents-first with siblings in rank order, so one pass in index order visits each sibling group
    # in order and reaches a node's children only after the node itself was accepted.
    for node in range(1, nodes + 1):
        tries = draft.parents[:, node] == current
        x_hot = torch.nn.functional.one_hot(tokens[:, node - 1], vocab).bool()
        if deterministic:
            q = x_hot.to(dtype)
            accept_prob = (p * q).sum(-1)  # p(x) / q(x) with q(x) = 1
        else:
            q = draft_probs[:, node - 1]
            if scheme == DraftScheme.WITHOUT_REPLACEMENT:
                q = q.masked_fill(removed, 0.0)
                q = q / q.sum(-1, keepdim=True).clamp_min(tiny)
            p_x, q_x = (p * x_hot).sum(-1), (q * x_hot).sum(-1)
            accept_prob = torch.where(q_x > 0, p_x / q_x.clamp_min(tiny), torch.zeros_like(q_x))
        accept_prob = torch.where(tries, accept_prob.clamp(max=1.0), torch.zeros_like(accept_prob))
        accepted = source.bernoulli(accept_prob) & tries
        rejected = tries & ~accepted
        p = torch.where(rejected[:, None], _normalised_residual(p, q), p)
        p = torch.where(accepted[:, None], target[:, node], p)
        if scheme == DraftScheme.WITHOUT_REPLACEMENT:
            removed = (removed | (rejected[:, None] & x_hot)) & ~accepted[:, None]
        current = torch.where(accepted, node, current)
    return _result(current, source.categorical(p), draft, depth)


@_verifier(lossless=True, exact_for=frozenset({DraftScheme.DETERMINISTIC}))
def verify_tree_deterministic(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Target-only recursive rejection for trees of deterministic drafts (top-k children, n-gram, argmax).

    Math: at the current node with target ``p``, try the (distinct) children ``x_1, x_2, ...`` in order::

        accept x_j  w.p.  p(x_j) / (1 - p(x_1) - ... - p(x_{j-1}))      (= the renormalised residual at x_j)
        on rejection: p <- p with x_j zeroed, renormalised
        accepted: descend with the child's fresh p;  all rejected: next ~ residual;  leaf: bonus ~ p

    This is the chain rule of "draw ``x ~ p``; descend if ``x`` is a child, else emit ``x``", so the emitted token
    has law ``p`` exactly, and the acceptance rate at a node is ``sum_children p(c)``, the most any verifier can
    get from a fixed candidate set. It is speculative sampling with a one-hot proposal per sibling. Exact for
    ``DETERMINISTIC`` drafts (``draft_probs`` is ignored: the tokens were not sampled from it).

    Args:
        target_probs: processed target distributions (``target_probs[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        source: a :class:`~specdec.sampling.RandomSource` or ``torch.Generator``.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult`.

    References:
        Li et al., "EAGLE-2", arXiv 2406.16858 (``evaluate_posterior``); SGLang
        ``tree_speculative_sampling_target_only`` with both thresholds 1.
    """
    _check_scheme("verify_tree_deterministic", draft, verify_tree_deterministic.exact_for)
    return _tree_rejection(
        target_probs, draft, source, max_depth, DraftScheme.DETERMINISTIC, "verify_tree_deterministic"
    )


@_verifier(lossless=True, exact_for=frozenset({DraftScheme.IID}))
def verify_tree_iid(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """SpecInfer multi-step speculative sampling for trees whose children were drawn i.i.d. from ``q``.

    Math: at the current node with target ``p`` and draft ``q`` (the parent's ``draft_probs``), try children in
    order::

        accept x_j  w.p.  min(1, p(x_j) / q(x_j))
        on rejection: p <- norm(max(p - q, 0))        (q unchanged: the next sibling is a fresh draw from q)
        accepted: descend;  all rejected: next ~ p (recovered);  leaf: bonus ~ p

    Each rejection step is one step of speculative sampling whose output law is ``p``; by induction over the
    siblings the emitted token has the target's law. Exact for ``IID`` drafts (a sampled chain included).

    Args:
        target_probs: processed target distributions (``target_probs[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree with ``draft_probs`` (row ``i - 1`` is the distribution node ``i`` was drawn
            from).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs ``[B, N, V]``.
        source: a :class:`~specdec.sampling.RandomSource` or ``torch.Generator``.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult`.

    References:
        Miao et al., "SpecInfer", arXiv 2305.09781 (multi-step speculative sampling).
    """
    _check_scheme("verify_tree_iid", draft, verify_tree_iid.exact_for)
    return _tree_rejection(target_probs, draft, source, max_depth, DraftScheme.IID, "verify_tree_iid")


@_verifier(lossless=True, exact_for=frozenset({DraftScheme.WITHOUT_REPLACEMENT}))
def verify_tree_without_replacement(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    *,
    max_depth: int | None = None,
) -> VerifyResult:
    """Recursive rejection sampling for trees whose siblings were drawn without replacement from ``q``.

    Math: sibling ``j`` was drawn from ``q_j = norm(q`` with ``x_1 .. x_{j-1}`` removed``)``, so it is tested
    against that::

        accept x_j  w.p.  min(1, p(x_j) / q_j(x_j))
        on rejection: p <- norm(max(p - q_j, 0));  q_{j+1} <- q_j with x_j removed, renormalised
        accepted: descend;  all rejected: next ~ p (recovered);  leaf: bonus ~ p

    Exact for ``WITHOUT_REPLACEMENT`` drafts (Gumbel-top-k, ``multinomial(replacement=False)``). A rejected
    ``x_j`` ends with ``p(x_j) = 0`` (``p(x_j) < q_j(x_j)``), so removing it from later proposals loses nothing.

    Args:
        target_probs: processed target distributions (``target_probs[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree with ``draft_probs`` (row ``i - 1``: the full distribution of node ``i``'s sibling
            group, before any sibling was removed).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs ``[B, N, V]``.
        source: a :class:`~specdec.sampling.RandomSource` or ``torch.Generator``.
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult`.

    References:
        Jeon et al., "Recursive Speculative Decoding", arXiv 2402.14160; Chen et al., "Sequoia",
        arXiv 2402.12374; EAGLE-1 (v1) ``evaluate_posterior``.
    """
    _check_scheme("verify_tree_without_replacement", draft, verify_tree_without_replacement.exact_for)
    return _tree_rejection(
        target_probs, draft, source, max_depth, DraftScheme.WITHOUT_REPLACEMENT, "verify_tree_without_replacement"
    )


# ----------------------------------------------------------------------------------------------------------------
# Typical acceptance (lossy)
# ----------------------------------------------------------------------------------------------------------------


@_verifier(lossless=False, exact_for=frozenset())
def verify_typical(
    target_probs: torch.Tensor,
    draft: Draft,
    source: RandomSource | torch.Generator,
    *,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    max_depth: int | None = None,
) -> VerifyResult:
    """Medusa typical acceptance. **Not lossless**: it trades fidelity to the target for longer acceptance.

    Math: with ``H(p)`` the entropy of the target at a node, a draft ``x`` under parent distribution ``p`` is
    *typical* iff ``p(x) > min(epsilon, alpha * exp(-H(p)))``. A node is accepted iff it and all its ancestors
    are typical (greedy, no coins); the chosen node is the deepest accepted one (ties: the largest summed
    ``log p`` along the path, then the smallest index). The next token is sampled from the chosen node's ``p``
    restricted to ``{v : p(v) >= threshold}`` (Medusa ``get_typical_one_token``; the argmax is always kept). A
    draft with no nodes (``N = 0``) samples the root's ``p`` unrestricted, as plain decoding does.

    Args:
        target_probs: processed target distributions (``target_probs[:, i]``: the token after node ``i``).
            Shape: ``[B, N + 1, V]``.
        draft: the draft tree (any scheme; ``draft_probs`` ignored).
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.
        source: a :class:`~specdec.sampling.RandomSource` or ``torch.Generator`` (for the next token only).
        posterior_threshold: ``epsilon`` (Medusa default 0.09).
        posterior_alpha: ``alpha`` (Medusa default 0.3, about ``sqrt(epsilon)``).
        max_depth: ``D``; ``None`` reads it from ``draft.depths`` (one host sync).

    Returns:
        :class:`VerifyResult`.

    References:
        Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads",
        arXiv 2401.10774, section 2.3.1 (typical acceptance).
    """
    if not (posterior_threshold >= 0 and posterior_alpha > 0):
        raise ValueError(
            f"verify_typical needs posterior_threshold >= 0 and posterior_alpha > 0, got "
            f"{posterior_threshold} and {posterior_alpha}"
        )
    batch, nodes, vocab = _check_inputs(target_probs, draft, False, "verify_typical")
    depth = _depth(draft, max_depth)
    source = as_source(source)
    target = target_probs.to(_work_dtype(target_probs))
    if nodes == 0:  # nothing drafted (e.g. no room left in the token budget): plain decoding, the whole target law
        root = torch.zeros(batch, dtype=torch.long, device=target.device)
        return _result(root, source.categorical(target[:, 0]), draft, depth)
    entropy = -torch.xlogy(target, target).sum(-1)
    threshold = torch.minimum(
        torch.full_like(entropy, posterior_threshold), posterior_alpha * torch.exp(-entropy)
    )  # [B, N + 1]
    parents = _safe_parents(draft.parents)
    flat = parents[:, 1:] * vocab + draft.tokens.clamp(0, vocab - 1)
    p_x = target.reshape(batch, -1).gather(1, flat)
    typical = (draft.parents[:, 1:] >= 0) & (p_x > threshold.gather(1, parents[:, 1:]))
    root = torch.ones(batch, 1, dtype=torch.bool, device=target.device)
    accepted = _and_over_path(torch.cat([root, typical], dim=1), draft.parents)
    log_p = torch.where(typical, p_x.clamp_min(torch.finfo(target.dtype).tiny).log(), torch.zeros_like(p_x))
    path_log_p = _sum_over_path(torch.cat([log_p.new_zeros(batch, 1), log_p], dim=1), draft.parents)
    deepest = torch.where(accepted, draft.depths, torch.full_like(draft.depths, -1)).amax(-1, keepdim=True)
    candidates = accepted & (draft.depths == deepest)
    best = torch.where(candidates, path_log_p, torch.full_like(path_log_p, -math.inf)).argmax(-1)

    p = _at_node(target, best)
    keep = (p >= threshold.gather(1, best[:, None])) | torch.nn.functional.one_hot(p.argmax(-1), vocab).bool()
    return _result(best, source.categorical(torch.where(keep, p, torch.zeros_like(p))), draft, depth)


# ----------------------------------------------------------------------------------------------------------------
# Choosing a verifier, reading its output, checking drafts
# ----------------------------------------------------------------------------------------------------------------

_TREE_VERIFIERS = {
    DraftScheme.DETERMINISTIC: verify_tree_deterministic,
    DraftScheme.IID: verify_tree_iid,
    DraftScheme.WITHOUT_REPLACEMENT: verify_tree_without_replacement,
}


def select_verifier(scheme: DraftScheme, params: SamplingParams, *, chain: bool = False) -> Verifier:
    """Pick the lossless verifier for drafts made by ``scheme`` under sampling ``params``.

    Rule: greedy params -> :func:`verify_greedy` (through :func:`specdec.kernels.verify_greedy`: its Triton kernel
    on CUDA, this module's function elsewhere); a chain (``chain=True``) -> :func:`verify_chain` (vectorised
    over positions); otherwise the tree verifier whose ``exact_for`` contains ``scheme``.

    Args:
        scheme: how the drafter chose its tokens (``Draft.scheme``).
        params: the run's sampling parameters.
        chain: the drafter proposes one child per node.

    Returns:
        A :class:`Verifier` ``(target_probs, draft, source, *, max_depth=None) -> VerifyResult`` with
        ``lossless == True``.

    References:
        See the verifiers' own references. The pairing rule: the verifier's draft law must match how the drafts
        were made (i.i.d. drafts: a fixed ``q``, SpecInfer arXiv 2305.09781; drafts without replacement: ``q``
        renormalised after each removal, RSD arXiv 2402.14160 and Sequoia arXiv 2402.12374; deterministic top-k
        drafts: target-only, EAGLE ``evaluate_posterior`` and SGLang ``tree_speculative_sampling_target_only``).
    """
    scheme = DraftScheme(scheme)
    if params.is_greedy:
        from .kernels import verify_greedy as dispatching  # the Triton kernel on CUDA, verify_greedy elsewhere

        return dispatching
    if chain:
        return verify_chain
    return _TREE_VERIFIERS[scheme]


def emitted_tokens(draft: Draft, result: VerifyResult) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens a verification step emits per row: the accepted drafts, then the next token.

    Math: row ``b`` emits ``tokens[b, accepted_nodes[b, j] - 1]`` for ``j = 1..num_accepted[b]``, then
    ``next_tokens[b]``.

    Args:
        draft: the verified draft.
            Shape: tokens ``[B, N]``.
        result: the verifier's output.
            Shape: accepted_nodes ``[B, D + 1]``, num_accepted and next_tokens ``[B]``.

    Returns:
        ``(tokens, counts)``: tokens of shape ``[B, D + 1]`` (``-1`` after the ``counts[b]`` emitted ones) and
        counts ``[B] = num_accepted + 1``. A draft without nodes (``D = 0``) emits the next token alone.

    Example:
        >>> draft = Draft(tokens=torch.tensor([[5, 6]]), parents=torch.tensor([[-1, 0, 1]]),
        ...               depths=torch.tensor([[0, 1, 2]]), draft_probs=None, scheme=DraftScheme.DETERMINISTIC)
        >>> result = VerifyResult(accepted_nodes=torch.tensor([[0, 1, -1]]), num_accepted=torch.tensor([1]),
        ...                       next_tokens=torch.tensor([9]))
        >>> emitted_tokens(draft, result)[0].tolist()
        [[5, 9, -1]]

    References:
        vLLM rejection sampler (``vllm/v1/sample/rejection_sampler.py``): its glossary (accepted, recovered,
        bonus tokens) and its ``-1``-padded ``[B, K + 1]`` output layout. The op itself is
        :func:`specdec.kernels.emitted_tokens` (kernel and reference).
    """
    from .kernels import emitted_tokens as dispatching  # one Triton launch on CUDA, the torch reference elsewhere

    return dispatching(draft.tokens, result.accepted_nodes, result.num_accepted, result.next_tokens)


def check_draft(draft: Draft, vocab_size: int | None = None, *, chain: bool = False) -> None:
    """Validate a draft's data (the verifiers only check shapes); reads the tensors, so it syncs.

    Checks: node 0 is the root (parent -1, depth 0); each present node's parent is a present node with a smaller
    index and its depth is the parent's plus one; absent nodes have depth 0 and no present children; tokens of
    present nodes lie in ``[0, vocab_size)``; ``draft_probs`` rows of present nodes are distributions; with
    ``chain=True``, each row is a chain ``0 <- 1 <- ... <- K_b`` followed by absent nodes.

    Args:
        draft: the draft to check.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs ``[B, N, V]`` or ``None``.
        vocab_size: ``V`` to check token ids against (``None`` skips the check).
        chain: also require the chain layout :func:`verify_chain` needs.

    Returns:
        ``None``; a valid draft passes silently.

    Raises:
        ValueError: naming the first offending row and node.

    References:
        :class:`specdec.types.Draft` (the layout contract).
    """
    parents, depths, tokens = draft.parents.cpu(), draft.depths.cpu(), draft.tokens.cpu()
    batch, nodes = tokens.shape
    if tuple(parents.shape) != (batch, nodes + 1) or tuple(depths.shape) != (batch, nodes + 1):
        raise ValueError(f"parents and depths must have shape [B, N + 1] = [{batch}, {nodes + 1}]")
    for b in range(batch):
        if parents[b, 0] != -1 or depths[b, 0] != 0:
            raise ValueError(f"row {b}: node 0 is the root and needs parent -1 and depth 0")
        present = [True] + [bool(parents[b, i] >= 0) for i in range(1, nodes + 1)]
        for i in range(1, nodes + 1):
            parent = int(parents[b, i])
            if not present[i]:
                if parent != -1 or depths[b, i] != 0:
                    raise ValueError(f"row {b}, node {i}: an absent node needs parent -1 and depth 0")
                continue
            if not parent < i:
                raise ValueError(f"row {b}, node {i}: parent {parent} must come before its child (breadth-first order)")
            if not present[parent]:
                raise ValueError(f"row {b}, node {i}: parent {parent} is absent; drop the child or keep the parent")
            if depths[b, i] != depths[b, parent] + 1:
                raise ValueError(f"row {b}, node {i}: depth {int(depths[b, i])} != parent depth + 1")
            if chain and parent != i - 1:
                raise ValueError(f"row {b}, node {i}: not a chain (parent {parent}); use a tree verifier")
            if vocab_size is not None and not 0 <= int(tokens[b, i - 1]) < vocab_size:
                raise ValueError(f"row {b}, node {i}: token {int(tokens[b, i - 1])} is outside [0, {vocab_size})")
        if chain and any(present[i] and not present[i - 1] for i in range(1, nodes + 1)):
            raise ValueError(f"row {b}: absent nodes must come after the chain's present nodes")
    if draft.draft_probs is not None:
        probs = draft.draft_probs.detach().cpu().double()
        present = parents[:, 1:] >= 0
        if (probs < 0).any():
            raise ValueError("draft_probs has negative entries; pass processed probabilities, not logits")
        sums = probs.sum(-1)[present]
        if sums.numel() and not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise ValueError("draft_probs rows of present nodes must sum to 1; pass processed probabilities")
