"""Tests of specdec.kernels.verify: greedy, chain and target-only tree verification kernels.

Tier 2 of the three (invariants, parity, law): each kernel equals its torch reference exactly (accepted paths,
counts, next tokens) under shared pre-drawn noise, over awkward shapes: batch 1 and odd sizes, vocabularies 8193
and 151936 (not powers of two), trees of 1 to 64 nodes, absent nodes, rows with no drafts, exact zeros in p and q,
ties in the logits.
Tier 3: the noise form is lossless: Monte Carlo chi-square tests of the emitted tokens' law against the exactly
enumerated target law, with the test's power stated, and negative-control mutants (resampling from p instead of
the residual) that fail the same test at the same sample count.
"""
from __future__ import annotations

import random

import pytest
import torch

from specdec.kernels import (
    draw_verify_noise,
    interpreter_enabled,
    kernel_mode,
    triton_available,
    verify_chain_noise,
    verify_chain_noise_ref,
    verify_greedy,
    verify_greedy_ref,
    verify_tree_deterministic_noise,
    verify_tree_deterministic_noise_ref,
)
from specdec.kernels import verify as kernels_verify
from specdec.sampling import PredrawnNoise, process_logits
from specdec.testing import (
    ToyLM,
    chain_parents,
    chi_square_test,
    detectable_tv,
    draft_iid,
    draft_top_k,
    target_law,
)
from specdec.types import Draft, DraftScheme, SamplingParams
from specdec.verify import verify_greedy as library_verify_greedy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    not triton_available() or (DEVICE == "cpu" and not interpreter_enabled()),
    reason="needs triton (and, without a GPU, TRITON_INTERPRET=1 before specdec.kernels is imported)",
)
DET, IID, WOR = DraftScheme.DETERMINISTIC, DraftScheme.IID, DraftScheme.WITHOUT_REPLACEMENT


def kernel(fn, *args, **kwargs):
    with kernel_mode("triton"):
        return fn(*args, **kwargs)


def assert_same(got, want):
    for name, g, w in zip(want._fields, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g.cpu(), w.cpu()), (name, g, w)


# ----------------------------------------------------------------------------------------------------------------
# Draft generators: ragged trees and chains
# ----------------------------------------------------------------------------------------------------------------


def random_tree(seed: int, batch: int, nodes: int, vocab: int, p_absent: float = 0.2, duplicates: bool = False):
    """Breadth-first trees, different per row (absent nodes anywhere; the last row of a batch drafts nothing)."""
    rng = random.Random(seed)
    parents = torch.full((batch, nodes + 1), -1, dtype=torch.long)
    depths = torch.zeros(batch, nodes + 1, dtype=torch.long)
    for b in range(batch):
        if batch > 1 and b == batch - 1:
            continue  # a row with no drafts
        alive, lowest = [0], 0
        for i in range(1, nodes + 1):
            if rng.random() < p_absent:
                continue
            parent = max(rng.choice(alive), lowest)  # parents never decrease: breadth-first order
            parents[b, i], depths[b, i], lowest = parent, depths[b, parent] + 1, parent
            alive.append(i)
    tokens = torch.randint(vocab, (batch, nodes), generator=torch.Generator().manual_seed(seed))
    if duplicates and nodes >= 2:  # siblings repeating a token (a drafter bug the verifier must survive)
        tokens[:, 1] = tokens[:, 0]
    return Draft(tokens, parents, depths, None, DET)


def random_chains(seed: int, batch: int, nodes: int, vocab: int, scheme: DraftScheme, q_zeros: bool = False):
    """Chains of K_b <= N drafts per row (K_b = 0 for one row), with draft_probs for sampled schemes."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    parents = torch.full((batch, nodes + 1), -1, dtype=torch.long)
    depths = torch.zeros(batch, nodes + 1, dtype=torch.long)
    for b in range(batch):
        k = 0 if (b == 0 and batch > 1) else rng.randint(1, nodes) if nodes else 0
        parents[b, 1 : k + 1] = torch.arange(k)
        depths[b, 1 : k + 1] = torch.arange(1, k + 1)
    probs = None
    if scheme != DET:
        logits = 3 * torch.randn(batch, nodes, vocab, generator=gen)
        if q_zeros:
            logits[torch.rand(batch, nodes, vocab, generator=gen) < 0.5] = -float("inf")
            logits[..., 0] = 0.0  # keep one token per row possible
        probs = torch.softmax(logits, -1)
        tokens = torch.multinomial(probs.reshape(-1, vocab), 1, generator=gen).reshape(batch, nodes)
    else:
        tokens = torch.randint(vocab, (batch, nodes), generator=gen)
    return Draft(tokens, parents, depths, probs, scheme)


def lucky(draft: Draft, target_probs: torch.Tensor, rate: float, seed: int) -> Draft:
    """Replace a fraction of draft tokens by the argmax at their parent, so that long paths get accepted."""
    gen = torch.Generator().manual_seed(seed)
    at_parent = target_probs.argmax(-1).gather(1, draft.parents[:, 1:].clamp_min(0))
    pick = torch.rand(draft.tokens.shape, generator=gen) < rate
    return draft._replace(tokens=torch.where(pick, at_parent, draft.tokens))


def to_device(draft: Draft) -> Draft:
    return Draft(draft.tokens.to(DEVICE), draft.parents.to(DEVICE), draft.depths.to(DEVICE),
                 None if draft.draft_probs is None else draft.draft_probs.to(DEVICE), draft.scheme)


def target_distributions(seed: int, batch: int, nodes: int, vocab: int, top_k: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(batch, nodes + 1, vocab, generator=gen)
    return process_logits(logits, SamplingParams(1.0, top_k=top_k))


# ----------------------------------------------------------------------------------------------------------------
# Greedy
# ----------------------------------------------------------------------------------------------------------------

GREEDY_CASES = [  # (batch, nodes, vocab, dtype, chain)
    (1, 0, 8193, torch.float32, False),
    (1, 1, 8193, torch.bfloat16, True),
    (3, 7, 8193, torch.float16, False),
    (3, 64, 300, torch.float32, False),
    (8, 9, 300, torch.float32, False),
    (3, 12, 1000, torch.float64, True),
    (1, 2, 151936, torch.float32, False),
]


@needs_kernels
@pytest.mark.parametrize("batch,nodes,vocab,dtype,chain", GREEDY_CASES,
                         ids=[f"B{b}-N{n}-V{v}-{str(d)[6:]}-{'chain' if c else 'tree'}" for b, n, v, d, c in
                              GREEDY_CASES])
def test_greedy_kernel_equals_reference(batch, nodes, vocab, dtype, chain):
    seed = batch * 1000 + nodes + vocab
    logits = torch.randn(batch, nodes + 1, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)
    draft = random_chains(seed, batch, nodes, vocab, DET) if chain else random_tree(seed, batch, nodes, vocab)
    draft = lucky(draft, logits.float(), 0.8, seed)
    logits, draft = logits.to(DEVICE), to_device(draft)
    want = verify_greedy_ref(logits, draft)
    assert_same(kernel(verify_greedy, logits, draft), want)
    assert_same(kernel(verify_greedy, logits, draft, max_depth=nodes + 2),
                verify_greedy_ref(logits, draft, max_depth=nodes + 2))
    if nodes >= 5:
        assert int(want.num_accepted.max()) >= 2  # the check saw accepted paths, not only roots


@needs_kernels
def test_greedy_kernel_ties_go_to_the_lowest_id_across_chunks(monkeypatch):
    # Logits with few distinct values: the row maximum repeats in every vocabulary chunk.
    monkeypatch.setattr(kernels_verify, "_TARGET_PROGRAMS", 64)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 3, (3, 4, 8193), generator=gen).float()
    logits[1, 2] = -float("inf")  # a row of -inf: argmax 0
    draft = lucky(random_tree(1, 3, 3, 8193, p_absent=0.0), logits, 1.0, 0)
    logits, draft = logits.to(DEVICE), to_device(draft)
    got = kernel(verify_greedy, logits, draft)
    assert_same(got, verify_greedy_ref(logits, draft))
    assert_same(got, library_verify_greedy(logits, draft))
    assert got.next_tokens.tolist() == logits[torch.arange(3), got.accepted_nodes.gather(
        1, got.num_accepted[:, None])[:, 0]].argmax(-1).tolist()


# ----------------------------------------------------------------------------------------------------------------
# Chain rejection sampling under noise
# ----------------------------------------------------------------------------------------------------------------

CHAIN_CASES = [  # (batch, nodes, vocab, scheme, target top_k, q with zeros, target dtype)
    (1, 0, 8193, IID, 0, False, torch.float32),
    (1, 1, 8193, DET, 0, False, torch.float32),
    (3, 5, 8193, IID, 50, True, torch.float32),
    (8, 4, 97, WOR, 3, False, torch.bfloat16),
    (3, 64, 50, DET, 5, False, torch.float64),
    (1, 3, 151936, IID, 0, False, torch.float32),
]
TRIALS = 3


@needs_kernels
@pytest.mark.parametrize("batch,nodes,vocab,scheme,top_k,q_zeros,dtype", CHAIN_CASES,
                         ids=[f"B{c[0]}-N{c[1]}-V{c[2]}-{c[3].name}-k{c[4]}" for c in CHAIN_CASES])
def test_chain_kernel_equals_reference_under_shared_noise(batch, nodes, vocab, scheme, top_k, q_zeros, dtype):
    seed = batch * 100 + nodes + vocab
    target = target_distributions(seed, batch, nodes, vocab, top_k).to(dtype)
    draft = random_chains(seed, batch, nodes, vocab, scheme, q_zeros)
    draft = lucky(draft, target.float(), 0.9, seed)
    target, draft = target.to(DEVICE), to_device(draft)
    accepted_any = False
    for trial in range(TRIALS if vocab < 100_000 else 1):
        noise = draw_verify_noise(torch.Generator().manual_seed(trial), batch, nodes, vocab, "cpu")
        noise = [t.to(DEVICE) for t in noise]
        want = verify_chain_noise_ref(target, draft, *noise)
        assert_same(kernel(verify_chain_noise, target, draft, *noise), want)
        accepted_any |= bool((want.num_accepted > 0).any())
        # the next token has positive target mass at the node it follows (zero-weight lanes never win)
        last = want.accepted_nodes.gather(1, want.num_accepted[:, None])[:, 0]
        assert bool((target[torch.arange(batch), last, want.next_tokens] > 0).all())
    if nodes:
        assert accepted_any


@needs_kernels
def test_chain_kernel_one_hot_targets_and_residual_without_mass():
    # Row 0: one-hot target and q == p: every draft is accepted and the bonus is the one-hot token. Row 1: an
    # unnormalised target p = q / 2 rejects half the time with a residual max(p - q, 0) of no mass, so the next
    # token falls back to p. Kernel and reference agree on both.
    vocab, nodes = 8193, 3
    q = torch.zeros(2, nodes, vocab)
    q[0, :, 5] = 1.0
    q[1] = torch.softmax(torch.randn(nodes, vocab, generator=torch.Generator().manual_seed(1)), -1)
    target = torch.cat([q, q[:, :1]], 1) * torch.tensor([1.0, 0.5])[:, None, None]
    parents = torch.tensor([chain_parents(nodes)] * 2)
    depths = torch.arange(nodes + 1).expand(2, -1)
    tokens = torch.tensor([[5, 5, 5], [1, 2, 3]])
    draft = Draft(tokens, parents, depths, q, IID)
    target, draft = target.to(DEVICE), to_device(draft)
    rejections = 0
    for trial in range(4):
        noise = [t.to(DEVICE) for t in draw_verify_noise(torch.Generator().manual_seed(trial), 2, nodes, vocab, "cpu")]
        want = verify_chain_noise_ref(target, draft, *noise)
        assert_same(kernel(verify_chain_noise, target, draft, *noise), want)
        assert want.num_accepted[0].item() == 3 and want.next_tokens[0].item() == 5
        n = want.num_accepted[1].item()
        rejections += n < 3
        assert target[1, n, want.next_tokens[1]] > 0
    assert rejections > 0


# ----------------------------------------------------------------------------------------------------------------
# Target-only tree rejection sampling under noise
# ----------------------------------------------------------------------------------------------------------------

TREE_CASES = [  # (batch, nodes, vocab, target top_k, duplicates)
    (1, 1, 8193, 0, False),
    (3, 16, 8193, 20, True),
    (8, 9, 61, 4, False),
    (3, 64, 40, 6, False),
    (1, 6, 151936, 3, False),
]


@needs_kernels
@pytest.mark.parametrize("batch,nodes,vocab,top_k,duplicates", TREE_CASES,
                         ids=[f"B{c[0]}-N{c[1]}-V{c[2]}-k{c[3]}{'-dup' if c[4] else ''}" for c in TREE_CASES])
def test_tree_kernel_equals_reference_under_shared_noise(batch, nodes, vocab, top_k, duplicates):
    seed = batch * 10 + nodes + vocab
    target = target_distributions(seed, batch, nodes, vocab, top_k)
    draft = lucky(random_tree(seed, batch, nodes, vocab, duplicates=duplicates), target, 0.9, seed)
    target, draft = target.to(DEVICE), to_device(draft)
    accepted_any = False
    for trial in range(TRIALS):
        if nodes >= 32 and accepted_any:
            break  # the interpreter walks 64 nodes slowly: one accepting draw is enough there
        noise = [t.to(DEVICE) for t in draw_verify_noise(torch.Generator().manual_seed(trial), batch, nodes, vocab,
                                                          "cpu")]
        want = verify_tree_deterministic_noise_ref(target, draft, *noise)
        assert_same(kernel(verify_tree_deterministic_noise, target, draft, *noise), want)
        accepted_any |= bool((want.num_accepted > 0).any())
        last = want.accepted_nodes.gather(1, want.num_accepted[:, None])[:, 0]
        assert bool((target[torch.arange(batch), last, want.next_tokens] > 0).all())
        # the token after the last accepted node is none of its (rejected) children
        for b in range(batch):
            node = int(last[b])
            kids = [int(draft.tokens[b, i - 1]) for i in range(1, nodes + 1) if int(draft.parents[b, i]) == node]
            assert int(want.next_tokens[b]) not in kids
    assert accepted_any or nodes <= 1


@needs_kernels
def test_tree_kernel_star_with_more_children_than_one_exclusion_group():
    # 40 children of the root (the kernel packs rejected children in groups of 16): when all are rejected, the next
    # token is none of them.
    batch, nodes, vocab = 3, 40, 300
    target = target_distributions(7, batch, nodes, vocab)
    parents = torch.tensor([[-1] + [0] * nodes] * batch)
    depths = torch.tensor([[0] + [1] * nodes] * batch)
    tokens = torch.stack([torch.randperm(vocab, generator=torch.Generator().manual_seed(b))[:nodes] for b in range(3)])
    draft = to_device(Draft(tokens, parents, depths, None, DET))
    target = target.to(DEVICE)
    all_rejected = 0
    for trial in range(3):
        noise = [t.to(DEVICE) for t in draw_verify_noise(torch.Generator().manual_seed(trial), batch, nodes, vocab,
                                                          "cpu")]
        want = verify_tree_deterministic_noise_ref(target, draft, *noise)
        assert_same(kernel(verify_tree_deterministic_noise, target, draft, *noise), want)
        for b in range(batch):
            if want.num_accepted[b] == 0:
                all_rejected += 1
                assert int(want.next_tokens[b]) not in tokens[b].tolist()
    assert all_rejected > 0


def test_tree_noise_verifier_refuses_sampled_drafts_and_bad_noise():
    draft = random_chains(0, 2, 3, 10, IID)
    target = target_distributions(0, 2, 3, 10)
    noise = draw_verify_noise(torch.Generator().manual_seed(0), 2, 3, 10, "cpu")
    with pytest.raises(ValueError, match="DETERMINISTIC drafts only"):
        verify_tree_deterministic_noise(target, draft, *noise)
    with pytest.raises(ValueError, match="draw_verify_noise"):
        verify_chain_noise(target, draft, noise.uniforms[:, :2], noise.exponentials)
    with pytest.raises(TypeError, match="raw noise"):
        draw_verify_noise(object(), 2, 3, 10, "cpu")


def test_draw_verify_noise_takes_uniforms_then_exponentials_from_the_source():
    source = PredrawnNoise(torch.arange(6) / 6, torch.arange(1, 11).double())
    noise = draw_verify_noise(source, 2, 3, 5, "cpu")
    assert noise.uniforms.flatten().tolist() == (torch.arange(6) / 6).double().tolist()
    assert noise.exponentials.flatten().tolist() == list(range(1, 11))
    assert noise.uniforms.dtype == noise.exponentials.dtype == torch.float64


# ----------------------------------------------------------------------------------------------------------------
# The noise form is lossless: Monte Carlo law tests with negative controls (torch references; the kernels equal
# them exactly, tested above)
# ----------------------------------------------------------------------------------------------------------------

# The Monte Carlo harness of tests/test_verify.py, shared (same rows, alpha and vocabulary).
from test_verify import MC_ALPHA, MC_ROWS, MC_VOCAB  # noqa: E402
from test_verify import _first_two_tokens as first_two_tokens  # noqa: E402


def noise_verifier(op):
    """A ``(target_probs, draft, source)`` verifier drawing its noise from ``source`` (a TorchSource)."""

    def verify(target_probs, draft, source):
        batch, nodes = draft.tokens.shape
        return op(target_probs, draft, *draw_verify_noise(source, batch, nodes, target_probs.shape[-1], "cpu"))

    return verify


def resample_from_p(op):
    """Mutant: after a rejection, draw the next token from the node's target p, not from the residual."""

    def verify(target_probs, draft, source):
        batch, nodes = draft.tokens.shape
        noise = draw_verify_noise(source, batch, nodes, target_probs.shape[-1], "cpu")
        result = op(target_probs, draft, *noise)
        last = result.accepted_nodes.gather(1, result.num_accepted[:, None])[:, 0]
        p = target_probs[torch.arange(batch), last].double()
        plain = torch.where(p > 0, p / noise.exponentials, -float("inf")).argmax(-1)
        has_children = ((draft.parents[:, 1:] == last[:, None]) & (draft.parents[:, 1:] >= 0)).any(-1)
        return result._replace(next_tokens=torch.where(has_children, plain, result.next_tokens))

    return verify


LAW_CASES = {
    "chain_iid_K3": (chain_parents(3), draft_iid, verify_chain_noise_ref),
    "chain_deterministic_K3": (chain_parents(3), draft_top_k, verify_chain_noise_ref),
    "tree_deterministic_3-1": ([-1, 0, 0, 0, 1], draft_top_k, verify_tree_deterministic_noise_ref),
    "tree_deterministic_2x2": ([-1, 0, 0, 1, 1, 2, 2], draft_top_k, verify_tree_deterministic_noise_ref),
}


@pytest.mark.parametrize("name", list(LAW_CASES))
def test_noise_form_follows_the_target_law_and_the_mutant_fails(name):
    # n = 200,000 rows; with <= 36 bins a chi-square test at alpha = 1e-3 detects any TV error >= 0.0096 with power
    # 0.99 (asserted below from the actual number of bins).
    parents, rule, op = LAW_CASES[name]
    target = ToyLM(MC_VOCAB, 1, peakiness=1.5, top_p=0.95)
    drafter = ToyLM(MC_VOCAB, 2, peakiness=1.0)
    law = target_law(target, 2)
    fit = chi_square_test(first_two_tokens(target, drafter, parents, rule, noise_verifier(op), seed=11), law)
    assert detectable_tv(MC_ROWS, fit.num_bins, alpha=MC_ALPHA, power=0.99) <= 0.01
    assert fit.p_value > MC_ALPHA, fit
    bad = chi_square_test(first_two_tokens(target, drafter, parents, rule, resample_from_p(op), seed=11), law)
    assert bad.p_value < MC_ALPHA, bad
