"""Tools to test that a speculative sampler is lossless: exact enumeration, toy models, statistical tests.

Three tiers, for our verifiers and for yours:

1. **Exact enumeration.** :class:`EnumeratingSource` is a :class:`~specdec.sampling.RandomSource` that does not
   sample: :func:`exact_distribution` re-runs your program over every sequence of random answers and returns the
   exact law of its outcome. It runs the *real* code (drafting rule + verifier), bugs included, so comparing the
   law of emitted tokens (:func:`speculative_law`) with the target's (:func:`target_law`) by
   :func:`total_variation` is a proof-grade check on toy models (:class:`ToyLM`).
2. **Monte Carlo** on many rows at once: :func:`chi_square_test` / :func:`g_test`, with the test's power stated by
   :func:`detectable_tv` and sized by :func:`samples_for_tv`.
3. **Negative controls**: feed the same tests a known-wrong sampler and check that they fail.

Example (a chain of 2 i.i.d. drafts verified by speculative sampling, exact to rounding)::

    target, drafter = ToyLM(5, seed=0), ToyLM(5, seed=1)
    law = speculative_law(target, drafter, 2, draft_iid, verify_chain, num_tokens=3)
    assert total_variation(law, target_law(target, 3)) < 1e-12
"""
from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any, NamedTuple

import torch

from .sampling import RandomSource, process_logits
from .types import Draft, DraftScheme, SamplingParams
from .verify import as_verifier, emitted_tokens

__all__ = [
    "EnumeratingSource",
    "exact_distribution",
    "ToyLM",
    "chain_parents",
    "depths_of",
    "draft_top_k",
    "draft_iid",
    "draft_without_replacement",
    "node_probs",
    "stack_drafts",
    "speculative_law",
    "target_law",
    "total_variation",
    "FitResult",
    "chi_square_test",
    "g_test",
    "detectable_tv",
    "samples_for_tv",
]

DraftingRule = Callable[..., Draft]


# ----------------------------------------------------------------------------------------------------------------
# Exact enumeration
# ----------------------------------------------------------------------------------------------------------------


class EnumeratingSource:
    """A :class:`~specdec.sampling.RandomSource` that branches instead of sampling (driven by
    :func:`exact_distribution`).

    Each call is one *choice* among the joint answers with positive probability: ``bernoulli`` branches every
    element with ``0 < p < 1`` into ``False`` / ``True`` (probabilities ``1 - p`` / ``p``; ``p`` of 0 or 1 does
    not branch); ``categorical`` branches every row over the indices with positive weight (probability
    ``w_i / sum(w)``; an all-zero row answers 0, as every source does). A tensor with several elements branches
    over the product of its elements' answers. Probabilities are multiplied in float64.

    Args:
        choices: the answer index to give at each call, in call order; calls beyond it take answer 0.

    Attributes:
        choices: the answer index given at each call so far.
        counts: the number of possible answers at each call so far.
        probability: the probability of the answers given so far.

    References:
        Exact enumeration oracles (the accept / residual recursion of Leviathan et al., arXiv 2211.17192, over
        every branch); this one runs the real code instead of a re-derivation of it.
    """

    def __init__(self, choices: Sequence[int] = ()) -> None:
        self._replay = tuple(choices)
        self.choices: list[int] = []
        self.counts: list[int] = []
        self.probability = 1.0

    def _choose(self, options: list[list[tuple[Any, float]]]) -> list[Any]:
        count = math.prod(len(o) for o in options)
        call = len(self.choices)
        pick = self._replay[call] if call < len(self._replay) else 0
        if pick >= count:
            raise RuntimeError(
                f"call {call} now has {count} answers but an earlier run saw more: the program must be a "
                "deterministic function of its random answers (no other randomness, no state kept between runs)"
            )
        self.choices.append(pick)
        self.counts.append(count)
        values = []
        for element in reversed(options):  # mixed-radix decoding of the joint answer index
            pick, digit = divmod(pick, len(element))
            value, prob = element[digit]
            values.append(value)
            self.probability *= prob
        return values[::-1]

    def bernoulli(self, probs: torch.Tensor) -> torch.Tensor:
        """Branch over the coins with probability strictly between 0 and 1.

        Args:
            probs: success probabilities in ``[0, 1]``.
                Shape: ``[...]``.

        Returns:
            Bool tensor of the same shape (this branch's answers).
        """
        options = []
        for p in probs.detach().reshape(-1).tolist():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"bernoulli probabilities must lie in [0, 1], got {p}")
            options.append([(p == 1.0, 1.0)] if p in (0.0, 1.0) else [(False, 1.0 - p), (True, p)])
        values = self._choose(options)
        return torch.tensor(values, dtype=torch.bool, device=probs.device).reshape(probs.shape)

    def categorical(self, weights: torch.Tensor) -> torch.Tensor:
        """Branch every row over its indices with positive weight.

        Args:
            weights: non-negative weights (an all-zero row answers 0).
                Shape: ``[..., V]``.

        Returns:
            Int64 tensor of shape ``[...]`` (this branch's answers).
        """
        if weights.dim() < 1 or weights.shape[-1] == 0:
            raise ValueError(f"categorical needs weights of shape [..., V] with V >= 1, got {tuple(weights.shape)}")
        options = []
        for row in weights.detach().reshape(-1, weights.shape[-1]).tolist():
            if any(not w >= 0.0 for w in row):
                raise ValueError(f"categorical weights must be >= 0 (and not NaN), got {row}")
            total = math.fsum(row)
            options.append([(i, w / total) for i, w in enumerate(row) if w > 0] if total > 0 else [(0, 1.0)])
        values = self._choose(options)
        return torch.tensor(values, dtype=torch.long, device=weights.device).reshape(weights.shape[:-1])


def _freeze(outcome: Any) -> Hashable:
    if isinstance(outcome, torch.Tensor):
        outcome = outcome.tolist()
    if isinstance(outcome, (list, tuple)):
        return tuple(_freeze(o) for o in outcome)
    return outcome


def exact_distribution(
    program: Callable[[RandomSource], Hashable], *, max_runs: int = 1_000_000
) -> dict[Hashable, float]:
    """The exact law of ``program(source)``'s outcome over all the random answers it could get.

    Math: depth-first search over answer sequences. Run the program with a prefix of fixed answers (answer 0
    after it); every call past the prefix spawns one new prefix per other answer. Each complete answer sequence
    is run once, its probability is the product of its answers' probabilities, and
    ``P(outcome) = sum over sequences giving that outcome``.

    Args:
        program: a function of a :class:`~specdec.sampling.RandomSource` returning a hashable outcome (tensors and
            lists are turned into tuples). It must take all its randomness from the source.
        max_runs: stop with an error past this many runs (the cost is one run per answer sequence).

    Returns:
        ``{outcome: probability}``; the probabilities sum to 1 up to float64 rounding.

    Example:
        >>> exact_distribution(lambda s: int(s.categorical(torch.tensor([1.0, 3.0]))))
        {0: 0.25, 1: 0.75}

    References:
        Exact enumeration of the verifier's output law, compared with the target's at tolerance 1e-12 (stricter
        than vLLM's Monte Carlo test, ``tests/v1/sample/test_rejection_sampler.py``).
    """
    law: dict[Hashable, float] = defaultdict(float)
    stack: list[tuple[int, ...]] = [()]
    runs = 0
    while stack:
        prefix = stack.pop()
        source = EnumeratingSource(prefix)
        outcome = _freeze(program(source))
        runs += 1
        if runs > max_runs:
            raise RuntimeError(f"exact_distribution: more than {max_runs} runs; shrink the vocabulary or the tree")
        law[outcome] += source.probability
        made = source.choices
        for call in range(len(prefix), len(made)):
            for answer in range(1, source.counts[call]):
                stack.append(tuple(made[:call]) + (answer,))
    return dict(law)


# ----------------------------------------------------------------------------------------------------------------
# Toy models and drafting rules
# ----------------------------------------------------------------------------------------------------------------


class ToyLM:
    """A deterministic toy language model: ``p(x | context)`` from a hash of the context (float64).

    Math: ``logits = peakiness * z`` with ``z ~ N(0, I_V)`` drawn from a generator seeded by a hash of
    ``(seed, context)``; ``p = process_logits(logits, SamplingParams(1.0, top_k, top_p))``, so ``top_k`` /
    ``top_p`` put exact zeros in ``p``. Small ``peakiness`` (0.1) gives near-uniform laws, large (5) peaky ones;
    ``top_k=1`` gives one-hot laws.

    Args:
        vocab_size: ``V``.
        seed: which model (two seeds give unrelated models: use one as target, another as draft).
        peakiness: logit scale.
        top_k: keep the ``top_k`` most likely tokens (0 keeps all).
        top_p: nucleus mass (1.0 keeps all).

    Example:
        >>> ToyLM(4, seed=0, top_k=2).probs([1, 2]).gt(0).sum().item()
        2

    References:
        Tiny synthetic models with prefix-dependent laws: a position-offset bug changes the law (vLLM's test
        shares one ``p`` across positions and cannot see one).
    """

    def __init__(self, vocab_size: int, seed: int, peakiness: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.peakiness = peakiness
        self.params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
        self._probs = lru_cache(maxsize=None)(self._compute)

    def __repr__(self) -> str:
        p = self.params
        return (
            f"ToyLM(V={self.vocab_size}, seed={self.seed}, peakiness={self.peakiness}, top_k={p.top_k}, "
            f"top_p={p.top_p})"
        )

    def _compute(self, context: tuple[int, ...]) -> torch.Tensor:
        key = f"{self.seed}|{','.join(map(str, context))}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)
        z = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return process_logits(self.peakiness * z, self.params)

    def probs(self, context: Sequence[int]) -> torch.Tensor:
        """``p(. | context)``, cached.

        Args:
            context: the tokens so far (may be empty).

        Returns:
            Float64 tensor of shape ``[V]``.
        """
        return self._probs(tuple(int(t) for t in context))

    def probs_batch(self, contexts: torch.Tensor) -> torch.Tensor:
        """``p(. | context)`` for many contexts, ``-1`` entries ignored (padding).

        Args:
            contexts: token ids.
                Shape: ``[M, L]`` int64.

        Returns:
            Shape ``[M, V]`` float64.
        """
        if contexts.shape[0] <= 64 or contexts.shape[1] == 0:  # few rows (enumeration): one cached lookup per row
            rows = contexts.tolist() if contexts.shape[1] else [[]] * contexts.shape[0]
            return torch.stack([self._probs(tuple(t for t in row if t >= 0)) for row in rows])
        base = self.vocab_size + 1
        if contexts.shape[1] * math.log2(base) < 62:  # rows as integers: a 1-D unique is much faster than dim=0
            weights = base ** torch.arange(contexts.shape[1] - 1, -1, -1, dtype=torch.long)
            _, first, inverse = _unique_rows((contexts + 1) @ weights)
            unique = contexts[first]
        else:
            unique, inverse = torch.unique(contexts, dim=0, return_inverse=True)
        table = torch.stack([self.probs([t for t in row if t >= 0]) for row in unique.tolist()])
        return table[inverse]


def _unique_rows(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unique keys, the index of one occurrence of each, and the inverse map."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.zeros(unique.numel(), dtype=torch.long).scatter_(0, inverse, torch.arange(keys.numel()))
    return unique, first, inverse


def chain_parents(num_drafts: int) -> list[int]:
    """The parents list of a chain of ``K`` draft nodes.

    Math: node ``i`` has parent ``i - 1``; the root (node 0) has parent ``-1``.

    Args:
        num_drafts: ``K``.

    Returns:
        ``[-1, 0, 1, ..., K - 1]`` (length ``K + 1``).

    References:
        :class:`specdec.types.Draft` (a chain is a tree with one child per node).
    """
    return [-1] + list(range(num_drafts))


def depths_of(parents: Sequence[int]) -> list[int]:
    """Depth of every node of a parents list.

    Math: ``depth(0) = 0``, ``depth(i) = depth(parents[i]) + 1``; absent nodes (parent -1) get 0.

    Args:
        parents: ``[-1, parent of node 1, ...]``, parents before children.

    Returns:
        Depths, same length.

    References:
        :class:`specdec.types.Draft`.
    """
    depths = [0] * len(parents)
    for i, parent in enumerate(parents[1:], start=1):
        if parent >= i:
            raise ValueError(f"node {i} has parent {parent}: parents must come before their children")
        depths[i] = depths[parent] + 1 if parent >= 0 else 0
    return depths


def _paths(parents: torch.Tensor, depths: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Draft tokens on the path root -> node, per row and node, ``-1`` padded: shape ``[B, N + 1, D]``.

    Absent nodes (parent -1) get the root's (empty) path.
    """
    batch, nodes = tokens.shape
    width = int(depths.max()) if depths.numel() else 0
    paths = torch.full((batch, nodes + 1, width), -1, dtype=torch.long)
    rows = torch.arange(batch)
    for node in range(1, nodes + 1):
        present = parents[:, node] >= 0
        path = paths[rows, parents[:, node].clamp_min(0)]
        column = (depths[:, node] - 1).clamp(0, max(width - 1, 0))
        path[rows[present], column[present]] = tokens[present, node - 1]
        paths[:, node] = path
    return paths


def _with_prefix(prefix: Sequence[int], paths: torch.Tensor) -> torch.Tensor:
    head = torch.tensor(list(prefix), dtype=torch.long).expand(*paths.shape[:-1], len(prefix))
    return torch.cat([head, paths], dim=-1)


def _draft_tree(draft_model: ToyLM, prefix, parents, batch_size, scheme, pick_children) -> Draft:
    parents = list(parents)
    if not parents or parents[0] != -1:
        raise ValueError(f"parents must start with -1 for the root, got {parents[:1]}")
    depths = depths_of(parents)
    nodes, vocab = len(parents) - 1, draft_model.vocab_size
    children: dict[int, list[int]] = defaultdict(list)
    for i, parent in enumerate(parents[1:], start=1):
        children[parent].append(i)
    tokens = torch.zeros(batch_size, nodes, dtype=torch.long)
    present = torch.ones(batch_size, nodes + 1, dtype=torch.bool)
    probs = torch.zeros(batch_size, nodes, vocab, dtype=torch.float64)
    paths = torch.full((batch_size, nodes + 1, max(depths)), -1, dtype=torch.long)
    head = torch.tensor(list(prefix), dtype=torch.long).expand(batch_size, -1)
    for node in range(nodes + 1):
        kids = children.get(node, [])
        if not kids:
            continue
        q = draft_model.probs_batch(torch.cat([head, paths[:, node, : depths[node]]], dim=1))
        picked, alive = pick_children(q, len(kids))
        for rank, kid in enumerate(kids):
            tokens[:, kid - 1] = picked[:, rank]
            probs[:, kid - 1] = q
            present[:, kid] = present[:, node] & alive[:, rank]
            paths[:, kid] = paths[:, node]
            paths[:, kid, depths[kid] - 1] = picked[:, rank]
    full_parents = torch.tensor(parents, dtype=torch.long).expand(batch_size, -1)
    full_depths = torch.tensor(depths, dtype=torch.long).expand(batch_size, -1)
    parents_t = torch.where(present, full_parents, torch.full_like(full_parents, -1))
    depths_t = torch.where(present, full_depths, torch.zeros_like(full_depths))
    draft_probs = None if scheme == DraftScheme.DETERMINISTIC else probs
    return Draft(tokens=tokens, parents=parents_t, depths=depths_t, draft_probs=draft_probs, scheme=scheme)


def draft_top_k(
    draft_model: ToyLM, prefix: Sequence[int], parents: Sequence[int], source: RandomSource | None = None,
    batch_size: int = 1,
) -> Draft:
    """Deterministic drafting: a node's ``k`` children are the draft's ``k`` most likely tokens (EAGLE-2 style).

    Ties go to the lowest id; a chain gives the draft's greedy continuation. ``draft_probs`` is ``None``.

    Args:
        draft_model: the draft's :class:`ToyLM`.
        prefix: committed tokens (the root is their last one; may be empty).
        parents: the tree shape, ``[-1, parent of node 1, ...]`` (see :func:`chain_parents`).
        source: unused (deterministic); accepted for a common drafting-rule signature.
        batch_size: ``B`` identical rows.

    Returns:
        A ``DETERMINISTIC`` :class:`Draft` with ``B`` rows and ``N = len(parents) - 1`` nodes; shapes tokens
        ``[B, N]``, parents and depths ``[B, N + 1]``.

    References:
        Li et al., "EAGLE-2", arXiv 2406.16858 (top-k expansion of the draft tree).
    """

    def pick(q: torch.Tensor, k: int):
        order = q.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        if order.shape[1] < k:
            raise ValueError(f"a node has {k} children but the vocabulary has only {q.shape[1]} tokens")
        return order, torch.ones_like(order, dtype=torch.bool)

    return _draft_tree(draft_model, prefix, parents, batch_size, DraftScheme.DETERMINISTIC, pick)


def draft_iid(
    draft_model: ToyLM, prefix: Sequence[int], parents: Sequence[int], source: RandomSource, batch_size: int = 1
) -> Draft:
    """I.i.d. drafting (SpecInfer): a node's children are independent draws from the draft's ``q`` there.

    Args:
        draft_model: the draft's :class:`ToyLM`.
        prefix: committed tokens (the root is their last one; may be empty).
        parents: the tree shape (a chain of sampled drafts is :func:`chain_parents`).
        source: where the draws come from.
        batch_size: ``B`` independent rows.

    Returns:
        An ``IID`` :class:`Draft`; shapes tokens ``[B, N]``, parents and depths ``[B, N + 1]``, draft_probs
        ``[B, N, V]``.

    References:
        Miao et al., "SpecInfer", arXiv 2305.09781.
    """

    def pick(q: torch.Tensor, k: int):
        picked = source.categorical(q[:, None, :].expand(-1, k, -1))
        return picked, torch.ones_like(picked, dtype=torch.bool)

    return _draft_tree(draft_model, prefix, parents, batch_size, DraftScheme.IID, pick)


def draft_without_replacement(
    draft_model: ToyLM, prefix: Sequence[int], parents: Sequence[int], source: RandomSource, batch_size: int = 1
) -> Draft:
    """Drafting without replacement (RSD, EAGLE-1 v1): siblings drawn one by one, earlier ones removed.

    When the draft's support runs out (fewer positive tokens than children), the remaining siblings and their
    subtrees are absent (parent -1), as a real drafter would propose fewer nodes.

    Args:
        draft_model: the draft's :class:`ToyLM`.
        prefix: committed tokens (the root is their last one; may be empty).
        parents: the tree shape.
        source: where the draws come from.
        batch_size: ``B`` independent rows.

    Returns:
        A ``WITHOUT_REPLACEMENT`` :class:`Draft`; shapes tokens ``[B, N]``, parents and depths ``[B, N + 1]``,
        draft_probs ``[B, N, V]`` (the full ``q`` of each sibling group).

    References:
        Jeon et al., "Recursive Speculative Decoding", arXiv 2402.14160; Chen et al., "Sequoia", arXiv 2402.12374.
    """

    def pick(q: torch.Tensor, k: int):
        remaining = q.clone()
        picked, alive = [], []
        for _ in range(k):
            has_mass = remaining.sum(-1) > 0
            x = source.categorical(remaining)
            remaining[torch.arange(q.shape[0]), x] = 0.0
            picked.append(x)
            alive.append(has_mass)
        return torch.stack(picked, 1), torch.stack(alive, 1)

    return _draft_tree(draft_model, prefix, parents, batch_size, DraftScheme.WITHOUT_REPLACEMENT, pick)


def node_probs(model: ToyLM, prefix: Sequence[int], draft: Draft) -> torch.Tensor:
    """The model's distribution after every node of a draft: what a target forward over the tree returns.

    Node ``i``'s context is ``prefix`` followed by the draft tokens on the path root -> ``i`` (absent nodes get
    the root's context).

    Args:
        model: a :class:`ToyLM` (usually the target).
        prefix: committed tokens (the root is their last one).
        draft: the draft tree.
            Shape: tokens ``[B, N]``, parents and depths ``[B, N + 1]``.

    Returns:
        Float64 tensor of shape ``[B, N + 1, V]`` (``[:, i]``: the law of the token after node ``i``).

    References:
        Tree attention: each node sees the prefix and its ancestors only (SpecInfer arXiv 2305.09781; Medusa
        arXiv 2401.10774).
    """
    tokens = draft.tokens.cpu()
    batch, nodes = tokens.shape
    contexts = _with_prefix(prefix, _paths(draft.parents.cpu(), draft.depths.cpu(), tokens))
    return model.probs_batch(contexts.reshape(batch * (nodes + 1), -1)).reshape(batch, nodes + 1, -1)


def stack_drafts(drafts: Sequence[Draft]) -> Draft:
    """Stack drafts of different sizes into one batch, padding with absent nodes (parent -1).

    Args:
        drafts: drafts of one scheme.
            Shape: tokens ``[B_j, N_j]``, draft_probs ``[B_j, N_j, V]`` or ``None``.

    Returns:
        A :class:`Draft` with ``sum B_j`` rows and ``max N_j`` nodes. ``draft_probs`` is ``None`` for
        ``DETERMINISTIC`` drafts, else padded with zeros (every input needs ``draft_probs``).

    References:
        :class:`specdec.types.Draft` (absent nodes pad rows that draft fewer nodes).
    """
    schemes = {d.scheme for d in drafts}
    if len(schemes) != 1:
        raise ValueError(f"stack_drafts needs drafts of one scheme, got {sorted(s.name for s in schemes)}")
    scheme = schemes.pop()
    nodes = max(d.tokens.shape[1] for d in drafts)

    def pad(t: torch.Tensor, value: float, length: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[1] = length - t.shape[1]
        return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=1)

    tokens = torch.cat([pad(d.tokens, 0, nodes) for d in drafts])
    parents = torch.cat([pad(d.parents, -1, nodes + 1) for d in drafts])
    depths = torch.cat([pad(d.depths, 0, nodes + 1) for d in drafts])
    if scheme == DraftScheme.DETERMINISTIC:
        probs = None
    else:
        if any(d.draft_probs is None for d in drafts):
            raise ValueError(f"every {scheme.name} draft needs draft_probs to be stacked")
        probs = torch.cat([pad(d.draft_probs, 0.0, nodes) for d in drafts])
    return Draft(tokens=tokens, parents=parents, depths=depths, draft_probs=probs, scheme=scheme)


# ----------------------------------------------------------------------------------------------------------------
# Laws of emitted tokens
# ----------------------------------------------------------------------------------------------------------------


def target_law(target: ToyLM, num_tokens: int, *, prefix: Sequence[int] = ()) -> dict[tuple[int, ...], float]:
    """The exact law of the target's next ``num_tokens`` tokens after ``prefix`` (plain sampling).

    Math: ``P(x_1..x_T) = prod_t p(x_t | prefix, x_<t)``, over sequences of positive probability.

    Args:
        target: the target :class:`ToyLM`.
        num_tokens: ``T``.
        prefix: committed tokens.

    Returns:
        ``{tokens: probability}`` with tuples of length ``T``.

    References:
        The reference law every lossless speculative loop must reproduce (Leviathan et al., arXiv 2211.17192).
    """
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(num_tokens):
        grown: dict[tuple[int, ...], float] = {}
        for seq, prob in law.items():
            for token, p in enumerate(target.probs(tuple(prefix) + seq).tolist()):
                if p > 0:
                    grown[seq + (token,)] = prob * p
        law = grown
    return law


def speculative_law(
    target: ToyLM,
    draft_model: ToyLM,
    tree: int | Sequence[int],
    drafting_rule: DraftingRule,
    verifier: Callable[..., Any],
    num_tokens: int,
    *,
    prefix: Sequence[int] = (),
    max_steps: int | None = None,
) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``num_tokens`` tokens emitted by a speculative loop, by enumeration.

    Each step drafts with ``drafting_rule`` at the current prefix, gets the target's :func:`node_probs`, runs
    ``verifier`` and emits :func:`~specdec.verify.emitted_tokens`; steps repeat until ``num_tokens`` tokens are
    out. Each step's law comes from :func:`exact_distribution` over the real drafting and verification code
    (memoised per prefix). After ``max_steps`` steps the remaining tokens come from the target's exact law: with
    ``max_steps=1`` this checks one step followed by plain decoding, the cheapest complete check of a step.

    A lossless (drafting rule, verifier) pair gives ``total_variation(speculative_law(...), target_law(...))``
    equal to 0 up to float64 rounding (about 1e-15).

    Args:
        target: the target :class:`ToyLM`.
        draft_model: the draft :class:`ToyLM` (may be ``target`` itself: ``q = p``).
        tree: a parents list (``[-1, ...]``) or an int ``K`` for a chain of ``K`` drafts (``0``: no drafts,
            plain sampling through the verifier).
        drafting_rule: ``rule(draft_model, prefix, parents, source) -> Draft`` (:func:`draft_top_k`,
            :func:`draft_iid`, :func:`draft_without_replacement` or yours).
        verifier: a :class:`~specdec.verify.Verifier`, called as in ``generate()``:
            ``verifier(target_probs, draft, source, max_depth=D) -> VerifyResult`` (a function without
            ``max_depth`` is wrapped by :func:`~specdec.verify.as_verifier`).
        num_tokens: how many emitted tokens the law covers.
        prefix: committed tokens before the first step.
        max_steps: speculative steps before falling back to plain target sampling (``None``: no limit).

    Returns:
        ``{tokens: probability}`` with tuples of length ``num_tokens``.

    Raises:
        ValueError: a step emitted no token or a ``-1`` (a verifier bug; the law would otherwise never finish).

    References:
        Enumeration oracles for the chain (arXiv 2211.17192), SpecInfer i.i.d. (arXiv 2305.09781),
        without-replacement (RSD arXiv 2402.14160, Sequoia arXiv 2402.12374) and target-only (EAGLE, SGLang)
        verifiers.
    """
    parents = chain_parents(tree) if isinstance(tree, int) else list(tree)
    max_depth = max(depths_of(parents))
    verifier = as_verifier(verifier)
    step_laws: dict[tuple[int, ...], dict] = {}

    def step_law(context: tuple[int, ...]) -> dict:
        if context not in step_laws:

            def program(source: RandomSource) -> tuple[int, ...]:
                draft = drafting_rule(draft_model, context, parents, source)
                result = verifier(node_probs(target, context, draft), draft, source, max_depth=max_depth)
                tokens, counts = emitted_tokens(draft, result)
                emitted = tuple(tokens[0, : int(counts[0])].tolist())
                if not emitted or any(t < 0 for t in emitted):
                    raise ValueError(
                        f"a step emitted {list(emitted)} at context {list(context)}: every step must emit at least "
                        "the next token (num_accepted + 1 real ids); check the verifier's VerifyResult"
                    )
                return emitted

            step_laws[context] = exact_distribution(program)
        return step_laws[context]

    @cache
    def law(context: tuple[int, ...], remaining: int, steps_left: int | None) -> dict:
        if remaining == 0:
            return {(): 1.0}
        if steps_left == 0:
            return target_law(target, remaining, prefix=context)
        out: dict[tuple[int, ...], float] = defaultdict(float)
        for emitted, prob in step_law(context).items():
            if len(emitted) >= remaining:
                out[emitted[:remaining]] += prob
                continue
            rest = law(context + emitted, remaining - len(emitted), None if steps_left is None else steps_left - 1)
            for tail, tail_prob in rest.items():
                out[emitted + tail] += prob * tail_prob
        return dict(out)

    return law(tuple(prefix), num_tokens, max_steps)


def total_variation(p: Mapping | torch.Tensor, q: Mapping | torch.Tensor) -> float | torch.Tensor:
    """Total-variation distance ``TV(p, q) = 1/2 sum_x |p(x) - q(x)| = max_A |p(A) - q(A)|``.

    Args:
        p: a law as ``{outcome: probability}`` or a tensor.
            Shape: ``[..., V]`` for tensors.
        q: the same kind as ``p``.
            Shape: ``[..., V]`` for tensors.

    Returns:
        A float for dicts (missing outcomes count as 0); a float64 tensor of shape ``[...]`` for tensors.

    References:
        Levin, Peres and Wilmer, "Markov Chains and Mixing Times", section 4.1.
    """
    if isinstance(p, Mapping) and isinstance(q, Mapping):
        return 0.5 * math.fsum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))
    if isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor):
        return 0.5 * (p.double() - q.double()).abs().sum(-1)
    raise TypeError(f"total_variation compares two dicts or two tensors, got {type(p).__name__} and {type(q).__name__}")


# ----------------------------------------------------------------------------------------------------------------
# Statistical tests and their power
# ----------------------------------------------------------------------------------------------------------------


def _scipy_stats():
    try:
        from scipy import stats
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("specdec.testing's statistical tests need scipy: pip install scipy") from error
    return stats


class FitResult(NamedTuple):
    """Outcome of a goodness-of-fit test.

    Attributes:
        statistic: the test statistic (``inf`` when an outcome of probability 0 was observed).
        dof: degrees of freedom (bins after merging, minus one).
        p_value: probability, under the null, of a statistic at least this large.
        num_bins: bins after merging.
    """

    statistic: float
    dof: int
    p_value: float
    num_bins: int


def _binned(counts, probs, min_expected: float):
    if isinstance(counts, Mapping) or isinstance(probs, Mapping):
        if not (isinstance(counts, Mapping) and isinstance(probs, Mapping)):
            raise TypeError("pass counts and probs both as dicts or both as tensors / arrays")
        keys = sorted(set(counts) | set(probs), key=repr)
        counts = [float(counts.get(k, 0)) for k in keys]
        probs = [float(probs.get(k, 0.0)) for k in keys]
    counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1)
    probs = torch.as_tensor(probs, dtype=torch.float64).reshape(-1)
    if counts.shape != probs.shape:
        raise ValueError(f"counts has {counts.numel()} bins but probs has {probs.numel()}")
    if (probs < 0).any() or abs(float(probs.sum()) - 1.0) > 1e-6:
        raise ValueError(f"probs must be a distribution (>= 0, sum 1), sums to {float(probs.sum())}")
    impossible = bool((counts[probs == 0] > 0).any())
    counts, probs = counts[probs > 0], probs[probs > 0]
    expected = counts.sum() * probs
    order = expected.argsort()
    counts, expected = counts[order], expected[order]
    small = int((expected < min_expected).sum())
    if small:
        # Pool the small bins (smallest first); if the pool is still small, add it to the next-smallest bin.
        pool_count, pool_expected = counts[:small].sum(), expected[:small].sum()
        counts, expected = counts[small:], expected[small:]
        if pool_expected < min_expected and counts.numel():
            counts = torch.cat([counts[:1] + pool_count, counts[1:]])
            expected = torch.cat([expected[:1] + pool_expected, expected[1:]])
        else:
            counts = torch.cat([pool_count[None], counts])
            expected = torch.cat([pool_expected[None], expected])
    return counts, expected, impossible


def _fit(counts, probs, min_expected: float, statistic: Callable) -> FitResult:
    observed, expected, impossible = _binned(counts, probs, min_expected)
    bins = observed.numel()
    if impossible:
        return FitResult(math.inf, max(bins - 1, 0), 0.0, bins)
    if bins < 2:
        return FitResult(0.0, 0, 1.0, bins)
    value = float(statistic(observed, expected))
    return FitResult(value, bins - 1, float(_scipy_stats().chi2.sf(value, bins - 1)), bins)


def chi_square_test(counts, probs, *, min_expected: float = 5.0) -> FitResult:
    """Pearson's chi-square goodness-of-fit test of observed counts against a law.

    Math: ``X^2 = sum_bins (O - E)^2 / E`` with ``E = n * probs``, asymptotically ``chi2(bins - 1)`` under the
    null. Bins with ``E < min_expected`` are pooled (a pool still below it joins the next-smallest bin). An
    observation in a bin of probability 0 gives ``X^2 = inf`` and p-value 0. Power against any alternative at
    total-variation distance ``d`` (measured on the merged bins): see :func:`detectable_tv`.

    Args:
        counts: observed counts, a tensor / array / list or a dict ``{outcome: count}``.
            Shape: ``[bins]``.
        probs: the null law, same layout (dicts: outcomes missing from ``probs`` have probability 0).
        min_expected: the smallest expected count a bin may have.

    Returns:
        :class:`FitResult` ``(statistic, dof, p_value, num_bins)``.

    References:
        Pearson (1900); Cochran, "Some Methods for Strengthening the Common chi2 Tests", Biometrics 1954.
    """
    return _fit(counts, probs, min_expected, lambda o, e: ((o - e) ** 2 / e).sum())


def g_test(counts, probs, *, min_expected: float = 5.0) -> FitResult:
    """The G-test (likelihood-ratio) of observed counts against a law; same binning and power as
    :func:`chi_square_test`.

    Math: ``G = 2 sum_bins O ln(O / E)`` (empty bins contribute 0), asymptotically ``chi2(bins - 1)``.

    Args:
        counts: observed counts, or a dict ``{outcome: count}``.
            Shape: ``[bins]``.
        probs: the null law, same layout.
        min_expected: the smallest expected count a bin may have.

    Returns:
        :class:`FitResult`.

    References:
        Sokal and Rohlf, "Biometry" (G-test); Wilks (1938).
    """
    return _fit(counts, probs, min_expected, lambda o, e: 2.0 * torch.xlogy(o, o / e).sum())


def _noncentrality(num_bins: int, alpha: float, power: float) -> float:
    if num_bins < 2:
        raise ValueError(f"a goodness-of-fit test needs at least 2 bins, got {num_bins}")
    if not (0 < alpha < 1 and alpha < power < 1):
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    stats = _scipy_stats()
    dof = num_bins - 1
    critical = stats.chi2.isf(alpha, dof)
    gap = lambda lam: stats.ncx2.sf(critical, dof, lam) - power  # noqa: E731 - a one-off root function
    high = 1.0
    while gap(high) < 0:
        high *= 2.0
    from scipy.optimize import brentq

    return float(brentq(gap, 0.0, high, xtol=1e-10, rtol=1e-12))


def detectable_tv(num_samples: int, num_bins: int, alpha: float = 1e-3, power: float = 0.99) -> float:
    """The smallest total-variation error a chi-square test on ``num_samples`` samples detects with ``power``.

    Math: under an alternative ``p'`` the statistic is asymptotically noncentral ``chi2(bins - 1, lambda)``
    with ``lambda = n sum (p' - p)^2 / p``. By Cauchy-Schwarz, ``(sum |p' - p|)^2 <= sum (p' - p)^2 / p``, so
    every alternative with ``TV(p', p) = d`` has ``lambda >= 4 n d^2`` and is rejected at level ``alpha`` with
    probability at least ``P(ncx2(bins - 1, 4 n d^2) > chi2.isf(alpha, bins - 1))``. This returns the ``d`` where
    that bound equals ``power``: every alternative at least that far from the null is caught with probability
    ``>= power`` (asymptotically; the G-test has the same asymptotic power).

    Args:
        num_samples: ``n``.
        num_bins: bins of the test (after merging), ``dof + 1``.
        alpha: the test's level.
        power: the required probability of rejecting.

    Returns:
        ``d = sqrt(lambda* / (4 n))``.

    References:
        Cohen, "Statistical Power Analysis for the Behavioral Sciences" (chi-square power via the noncentral
        chi-square).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    return math.sqrt(_noncentrality(num_bins, alpha, power) / (4.0 * num_samples))


def samples_for_tv(tv: float, num_bins: int, alpha: float = 1e-3, power: float = 0.99) -> int:
    """The number of samples a chi-square test needs to catch any TV error ``>= tv`` with ``power``.

    Math: the inverse of :func:`detectable_tv`: ``n = ceil(lambda* / (4 tv^2))``.

    Args:
        tv: the total-variation error to detect, in ``(0, 1]``.
        num_bins: bins of the test (after merging).
        alpha: the test's level.
        power: the required probability of rejecting.

    Returns:
        ``n``.

    References:
        See :func:`detectable_tv`.
    """
    if not 0 < tv <= 1:
        raise ValueError(f"tv must lie in (0, 1], got {tv}")
    return math.ceil(_noncentrality(num_bins, alpha, power) / (4.0 * tv * tv))
