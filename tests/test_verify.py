"""Tests of specdec.verify.

Three tiers: deterministic invariants; parity under shared noise; the law of the emitted tokens
by exact enumeration of the real code (TV < 1e-9 against the target) and by Monte Carlo with a stated power,
each with negative controls (known-wrong mutants, defined below) that must fail the same test.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from specdec import kernels
from specdec.sampling import PredrawnNoise, TorchSource, process_logits
from specdec.testing import (
    ToyLM,
    chain_parents,
    chi_square_test,
    detectable_tv,
    draft_iid,
    draft_top_k,
    draft_without_replacement,
    exact_distribution,
    node_probs,
    speculative_law,
    stack_drafts,
    target_law,
    total_variation,
)
from specdec.types import Draft, DraftScheme, SamplingParams, VerifyResult
from specdec.verify import (
    Verifier,
    as_verifier,
    check_draft,
    emitted_tokens,
    select_verifier,
    verifier_input,
    verify_chain,
    verify_greedy,
    verify_tree_deterministic,
    verify_tree_iid,
    verify_tree_without_replacement,
    verify_typical,
)

DET, IID, WOR = DraftScheme.DETERMINISTIC, DraftScheme.IID, DraftScheme.WITHOUT_REPLACEMENT
SHAPES = {
    "chain1": chain_parents(1),
    "chain3": chain_parents(3),
    "chain5": chain_parents(5),
    "2": [-1, 0, 0],
    "2x2": [-1, 0, 0, 1, 1, 2, 2],
    "3-1": [-1, 0, 0, 0, 1],
    "1-3-1": [-1, 0, 1, 1, 1, 2],
}
LOSSLESS = [verify_greedy, verify_chain, verify_tree_deterministic, verify_tree_iid, verify_tree_without_replacement]
STOCHASTIC = [verify_chain, verify_tree_deterministic, verify_tree_iid, verify_tree_without_replacement]
RULE_FOR = {DET: draft_top_k, IID: draft_iid, WOR: draft_without_replacement}


# ----------------------------------------------------------------------------------------------------------------
# Toy models and the readable per-row oracle (also the base of the mutants)
# ----------------------------------------------------------------------------------------------------------------


def toy(kind: str, vocab: int, seed: int) -> ToyLM:
    """Targets and drafts of different character: peaky, near-uniform, with top-k / top-p zeros, one-hot."""
    return {
        "peaky": lambda: ToyLM(vocab, seed, peakiness=3.0),
        "flat": lambda: ToyLM(vocab, seed, peakiness=0.2),
        "topk": lambda: ToyLM(vocab, seed, peakiness=1.0, top_k=2),
        "topp": lambda: ToyLM(vocab, seed, peakiness=1.5, top_p=0.7),
        "other": lambda: ToyLM(vocab, seed + 100, peakiness=1.0),
        "sparse": lambda: ToyLM(vocab, seed + 100, peakiness=1.0, top_k=2),
        "onehot": lambda: ToyLM(vocab, seed + 100, peakiness=1.0, top_k=1),
    }[kind]()


def reference_verify(target_probs, draft, source, *, scheme, bug=None, max_depth=None) -> VerifyResult:
    """One row at a time, one sibling at a time: the tree walk as the papers state it.

    ``bug`` plants a known mistake: ``"resample_from_p"`` draws the token after a rejection from the node's
    target ``p`` instead of the residual; ``"keep_rejected"`` never updates ``p`` after a rejection (forgets to
    remove the rejected sibling).
    """
    batch, width, vocab = target_probs.shape
    depth = draft.max_depth if max_depth is None else max_depth
    paths, counts, nexts = [], [], []
    for b in range(batch):
        parents = draft.parents[b].tolist()
        current, p = 0, target_probs[b, 0].double()
        while True:
            kids = [i for i in range(1, width) if parents[i] == current]
            p_node, moved = p, False
            removed = torch.zeros(vocab, dtype=torch.bool)
            for i in kids:
                x = int(draft.tokens[b, i - 1])
                if scheme == DET:
                    q = torch.nn.functional.one_hot(torch.tensor(x), vocab).double()
                else:
                    q = draft.draft_probs[b, i - 1].double()
                    if scheme == WOR:
                        q = q.masked_fill(removed, 0.0)
                        q = q / q.sum()
                a = min(1.0, float(p[x] / q[x])) if q[x] > 0 else 0.0
                if bool(source.bernoulli(torch.tensor([a], dtype=torch.float64))[0]):
                    current, p, moved = i, target_probs[b, i].double(), True
                    break
                if bug != "keep_rejected":
                    residual = (p - q).clamp_min(0)
                    p = residual / residual.sum() if residual.sum() > 0 else p
                removed[x] = True
            if not moved:
                break
        final = p_node if bug == "resample_from_p" else p
        nexts.append(int(source.categorical(final[None])[0]))
        path, node = [], current
        while node >= 0:
            path.append(node)
            node = parents[node]
        counts.append(len(path) - 1)
        paths.append(path[::-1] + [-1] * (depth + 1 - len(path)))
    return VerifyResult(accepted_nodes=torch.tensor(paths), num_accepted=torch.tensor(counts),
                        next_tokens=torch.tensor(nexts))


def relabel(verifier: Callable, scheme: DraftScheme) -> Callable:
    """A verifier applied to drafts it was not made for (the draft claims another scheme)."""
    return lambda target_probs, draft, source, *, max_depth=None: verifier(
        target_probs, draft._replace(scheme=scheme), source, max_depth=max_depth)


def draft_top_k_with_softmax(draft_model, prefix, parents, source, batch_size=1):
    """Top-k (deterministic) drafts that carry the draft softmax and claim to be i.i.d. samples from it."""
    draft = draft_top_k(draft_model, prefix, parents, source, batch_size)
    return draft._replace(draft_probs=_draft_softmax(draft_model, prefix, draft), scheme=IID)


def _draft_softmax(draft_model, prefix, draft):
    return node_probs(draft_model, prefix, draft).gather(
        1, draft.parents[:, 1:].clamp_min(0)[..., None].expand(-1, -1, draft_model.vocab_size))


# The four mutants of the negative controls (each a small, plausible mistake).
def mutant_resample_from_p(target_probs, draft, source, *, max_depth=None):
    return reference_verify(target_probs, draft, source, scheme=draft.scheme, bug="resample_from_p",
                            max_depth=max_depth)


def mutant_keep_rejected_sibling(target_probs, draft, source, *, max_depth=None):
    return reference_verify(target_probs, draft, source, scheme=draft.scheme, bug="keep_rejected",
                            max_depth=max_depth)


mutant_wor_with_fixed_q = relabel(verify_tree_iid, IID)  # q not renormalised after removing siblings
mutant_top_k_with_draft_softmax = verify_tree_iid  # used with draft_top_k_with_softmax


# ----------------------------------------------------------------------------------------------------------------
# Exact enumeration: every lossless verifier reproduces the target's law on >= 50 configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    verifier: Callable
    scheme: DraftScheme
    shape: str
    vocab: int
    target: str
    draft: str
    seed: int
    max_steps: int | None = 1

    @property
    def id(self) -> str:
        steps = "" if self.max_steps == 1 else "-multistep"
        models = f"V{self.vocab}-{self.target}-q_{self.draft}-s{self.seed}"
        return f"{self.verifier.__name__}-{self.scheme.value}-{self.shape}-{models}{steps}"


def _cases() -> list[Case]:
    cases = []
    targets = ["peaky", "flat", "topk", "topp"]
    # Deterministic drafts (top-k children; chains are the draft's greedy continuation), cheap to enumerate.
    for i, (shape, target) in enumerate((s, t) for s in SHAPES for t in targets):
        cases.append(Case(verify_tree_deterministic, DET, shape, 4, target, ["other", "peaky"][i % 2], i))
    for i, (shape, target) in enumerate((s, t) for s in ["chain1", "chain3", "chain5"] for t in targets):
        cases.append(Case(verify_chain, DET, shape, 4, target, "other", 30 + i))
    # Sampled chains (Leviathan / Chen): i.i.d. drafts, including q = p and one-hot q.
    for i, target in enumerate(targets):
        cases.append(Case(verify_chain, IID, "chain1", 4, target, ["other", "onehot", "sparse", "other"][i], 50 + i))
        cases.append(Case(verify_chain, IID, "chain3", 3, target, "other", 60 + i))
    cases.append(Case(verify_chain, IID, "chain3", 3, "peaky", "same", 70))
    cases.append(Case(verify_chain, IID, "chain3", 4, "topk", "onehot", 71))
    cases.append(Case(verify_chain, IID, "chain5", 3, "flat", "sparse", 72))
    cases.append(Case(verify_chain, WOR, "chain3", 3, "topp", "other", 73))
    # I.i.d. trees (SpecInfer).
    cases += [
        Case(verify_tree_iid, IID, "3-1", 3, "peaky", "other", 80),
        Case(verify_tree_iid, IID, "3-1", 3, "topk", "same", 81),
        Case(verify_tree_iid, IID, "1-3-1", 3, "flat", "sparse", 82),
        Case(verify_tree_iid, IID, "2x2", 4, "topp", "sparse", 83),
        Case(verify_tree_iid, IID, "chain3", 3, "peaky", "other", 84),
        Case(verify_tree_iid, IID, "2x2", 4, "peaky", "onehot", 85),
        Case(verify_tree_iid, IID, "2", 3, "flat", "other", 86),
    ]
    # Without-replacement trees (RSD / Sequoia).
    cases += [
        Case(verify_tree_without_replacement, WOR, "3-1", 3, "peaky", "other", 90),
        Case(verify_tree_without_replacement, WOR, "3-1", 3, "flat", "same", 91),
        Case(verify_tree_without_replacement, WOR, "3-1", 4, "topk", "sparse", 92),
        Case(verify_tree_without_replacement, WOR, "1-3-1", 3, "topp", "other", 93),
        Case(verify_tree_without_replacement, WOR, "2x2", 4, "peaky", "sparse", 94),
        Case(verify_tree_without_replacement, WOR, "chain3", 3, "flat", "onehot", 95),
        Case(verify_tree_without_replacement, WOR, "2", 3, "flat", "other", 96),
    ]
    # Several speculative steps in a row (the loop, not just one step followed by plain decoding).
    cases += [
        Case(verify_tree_deterministic, DET, "2x2", 3, "peaky", "other", 100, max_steps=None),
        Case(verify_chain, IID, "chain1", 3, "topp", "other", 101, max_steps=None),
        Case(verify_tree_without_replacement, WOR, "3-1", 3, "topk", "sparse", 102, max_steps=None),
    ]
    return cases


CASES = _cases()


def _models(case: Case) -> tuple[ToyLM, ToyLM]:
    target = toy(case.target, case.vocab, case.seed)
    return target, (target if case.draft == "same" else toy(case.draft, case.vocab, case.seed))


def enumeration_tv(case: Case, verifier: Callable | None = None, rule: Callable | None = None) -> float:
    """TV between the exact law of the tokens a speculative loop emits and the target's law."""
    target, drafter = _models(case)
    parents = SHAPES[case.shape]
    num_tokens = max(max(_depths(parents)) + 1, 2) + (1 if case.max_steps is None else 0)
    law = speculative_law(target, drafter, parents, rule or RULE_FOR[case.scheme], verifier or case.verifier,
                          num_tokens, max_steps=case.max_steps)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    return total_variation(law, target_law(target, num_tokens))


def _depths(parents):
    depths = [0] * len(parents)
    for i, parent in enumerate(parents[1:], start=1):
        depths[i] = depths[parent] + 1
    return depths


def test_enumeration_covers_at_least_50_configurations():
    assert len(CASES) + len(ZERO_DRAFT_BATCHES) + len(GREEDY_CASES) >= 50
    assert {c.shape for c in CASES} == set(SHAPES)
    assert {c.verifier for c in CASES} == set(STOCHASTIC)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_lossless_verifier_matches_target_law_exactly(case):
    assert enumeration_tv(case) < 1e-9


GREEDY_CASES = [(shape, kind, 110 + i) for i, (shape, kind) in enumerate(
    (s, k) for s in ["chain3", "2x2", "3-1", "1-3-1"] for k in ["peaky", "flat"])]


@pytest.mark.parametrize("shape,kind,seed", GREEDY_CASES)
def test_greedy_verifier_matches_greedy_target_law_exactly(shape, kind, seed):
    # At temperature 0 the target's law is the one-hot of its argmax (top_k=1 is that law); any drafter.
    target = ToyLM(4, seed, peakiness=1.0, top_k=1)
    drafter = toy(kind, 4, seed)
    law = speculative_law(target, drafter, SHAPES[shape], draft_top_k, verify_greedy, 4, max_steps=None)
    assert total_variation(law, target_law(target, 4)) < 1e-9


def _batch_law(target, drafter, shapes, rule, verifier, num_tokens=2):
    """Exact joint law of each row's first ``num_tokens`` tokens for a batch of rows with different trees.

    One verification step over the stacked batch; rows that emit fewer tokens continue by plain target sampling.
    """

    def program(source):
        draft = stack_drafts([rule(drafter, (), shape, source) for shape in shapes])
        tokens, counts = emitted_tokens(draft, verifier(node_probs(target, (), draft), draft, source))
        return tuple(tuple(tokens[b, : int(counts[b])].tolist()) for b in range(len(shapes)))

    joint = defaultdict(float)
    for rows, prob in exact_distribution(program).items():
        laws = [
            {row + tail: pt for tail, pt in target_law(target, num_tokens - len(row), prefix=row).items()}
            if len(row) < num_tokens else {row[:num_tokens]: 1.0}
            for row in rows
        ]
        completions = {(): prob}
        for law in laws:
            completions = {k + (seq,): pk * ps for k, pk in completions.items() for seq, ps in law.items()}
        for k, pk in completions.items():
            joint[k] += pk
    return joint


ZERO_DRAFT_BATCHES = [
    (verify_chain, DET, ["chain3", "root", "chain1"], "peaky", 4),
    (verify_chain, IID, ["chain1", "root", "root"], "topk", 3),
    (verify_tree_deterministic, DET, ["2x2", "root", "1-3-1"], "flat", 3),
    (verify_tree_iid, IID, ["chain1", "root", "root"], "topp", 4),
    (verify_tree_without_replacement, WOR, ["3-1", "root"], "peaky", 3),
    (verify_greedy, DET, ["2x2", "root", "chain3"], "greedy", 4),
    (verify_chain, IID, ["root", "root"], "peaky", 4),
    (verify_tree_deterministic, DET, ["root", "root", "root"], "topk", 4),
]


@pytest.mark.parametrize("verifier,scheme,shapes,kind,vocab", ZERO_DRAFT_BATCHES,
                         ids=[f"{v.__name__}-{'+'.join(s)}" for v, _, s, _, _ in ZERO_DRAFT_BATCHES])
def test_batch_rows_with_zero_drafts_follow_target_law(verifier, scheme, shapes, kind, vocab):
    seed = 7 * len(shapes) + vocab
    target = ToyLM(vocab, seed, top_k=1) if kind == "greedy" else toy(kind, vocab, seed)
    drafter = toy("other", vocab, seed)
    parents = [[-1] if s == "root" else SHAPES[s] for s in shapes]
    joint = _batch_law(target, drafter, parents, RULE_FOR[scheme], verifier)
    row_law = target_law(target, 2)
    expected = {(): 1.0}
    for _ in shapes:  # rows are independent and each follows the target
        expected = {k + (seq,): pk * ps for k, pk in expected.items() for seq, ps in row_law.items()}
    assert total_variation(joint, expected) < 1e-9


def test_reference_oracle_agrees_with_library_verifiers():
    # The readable per-row walk (the mutants' base) is itself exact: the mutants differ from it by one bug only.
    picks = [("verify_tree_deterministic", "2x2"), ("verify_tree_iid", "3-1"),
             ("verify_tree_without_replacement", "3-1"), ("verify_chain", "chain3")]

    def oracle(t, d, s, *, max_depth=None):
        return reference_verify(t, d, s, scheme=d.scheme, max_depth=max_depth)

    for name, shape in picks:
        case = next(c for c in CASES if c.verifier.__name__ == name and c.shape == shape)
        assert enumeration_tv(case, verifier=oracle) < 1e-9


NEGATIVE_CONTROLS = {
    # mutant name: (case it runs on, verifier, drafting rule)
    "resample_from_p_chain": (Case(verify_chain, IID, "chain3", 3, "peaky", "other", 60), mutant_resample_from_p, None),
    "resample_from_p_tree": (Case(verify_tree_deterministic, DET, "3-1", 4, "flat", "other", 3),
                             mutant_resample_from_p, None),
    "forget_to_remove_rejected_sibling": (Case(verify_tree_deterministic, DET, "3-1", 4, "peaky", "other", 12),
                                          mutant_keep_rejected_sibling, None),
    "wrong_q_for_without_replacement": (Case(verify_tree_without_replacement, WOR, "2", 4, "flat", "other", 93),
                                        mutant_wor_with_fixed_q, None),
    "top_k_drafts_verified_with_draft_softmax": (Case(verify_tree_deterministic, DET, "3-1", 4, "topp", "other", 14),
                                                 mutant_top_k_with_draft_softmax, draft_top_k_with_softmax),
}


@pytest.mark.parametrize("name", list(NEGATIVE_CONTROLS))
def test_negative_control_mutant_is_caught_by_enumeration(name):
    case, mutant, rule = NEGATIVE_CONTROLS[name]
    assert enumeration_tv(case) < 1e-9  # the same configuration passes with the right verifier
    assert enumeration_tv(case, verifier=mutant, rule=rule) > 1e-3


def test_typical_acceptance_is_marked_lossy_and_is_biased():
    assert verify_typical.lossless is False and verify_typical.exact_for == frozenset()
    case = Case(verify_typical, DET, "2x2", 4, "flat", "other", 5)
    assert enumeration_tv(case, verifier=verify_typical) > 1e-3


# ----------------------------------------------------------------------------------------------------------------
# Monte Carlo with TorchSource: samples are rows of one batch
# ----------------------------------------------------------------------------------------------------------------

MC_ROWS = 200_000  # rows (samples) per Monte Carlo test
MC_ALPHA = 1e-3
MC_VOCAB = 6


def _first_two_tokens(target, drafter, parents, rule, verifier, seed):
    """Counts of the first two emitted tokens over MC_ROWS independent rows (the 2nd by plain sampling if
    the step emitted one token)."""
    source = TorchSource(torch.Generator().manual_seed(seed))
    draft = rule(drafter, (), parents, source, MC_ROWS)
    tokens, counts = emitted_tokens(draft, verifier(node_probs(target, (), draft), draft, source))
    second = source.categorical(target.probs_batch(tokens[:, :1]))
    second = torch.where(counts >= 2, tokens[:, 1], second)
    pairs = torch.bincount(tokens[:, 0] * MC_VOCAB + second, minlength=MC_VOCAB**2)
    return {(a, b): int(pairs[a * MC_VOCAB + b]) for a in range(MC_VOCAB) for b in range(MC_VOCAB)}


def mutant_chain_resample_from_p(target_probs, draft, source, *, max_depth=None):
    """Vectorised bug A for chains: after a rejection draw the next token from p, not from the residual."""
    result = verify_chain(target_probs, draft, source, max_depth=max_depth)
    rows = torch.arange(target_probs.shape[0])
    fresh = source.categorical(target_probs[rows, result.num_accepted])
    rejected = result.num_accepted < (draft.parents[:, 1:] >= 0).sum(-1)
    return result._replace(next_tokens=torch.where(rejected, fresh, result.next_tokens))


MONTE_CARLO = {
    "chain_iid_K3": (chain_parents(3), draft_iid, verify_chain, mutant_chain_resample_from_p),
    "tree_without_replacement_2x2": (SHAPES["2x2"], draft_without_replacement, verify_tree_without_replacement,
                                     mutant_wor_with_fixed_q),
    "tree_deterministic_3-1": (SHAPES["3-1"], draft_top_k, verify_tree_deterministic, None),
}


@pytest.mark.parametrize("name", list(MONTE_CARLO))
def test_monte_carlo_chi_square_passes_and_mutant_fails_at_same_n(name):
    # n = 200,000 rows; with <= 36 bins a chi-square test at alpha = 1e-3 detects any TV error >= 0.0096 with
    # power 0.99 (asserted below from the actual number of bins).
    parents, rule, verifier, mutant = MONTE_CARLO[name]
    target = ToyLM(MC_VOCAB, 1, peakiness=1.5, top_p=0.95)
    drafter = ToyLM(MC_VOCAB, 2, peakiness=1.0)
    law = target_law(target, 2)
    fit = chi_square_test(_first_two_tokens(target, drafter, parents, rule, verifier, seed=11), law)
    assert detectable_tv(MC_ROWS, fit.num_bins, alpha=MC_ALPHA, power=0.99) <= 0.01
    assert fit.p_value > MC_ALPHA, fit
    if mutant is None:  # the deterministic-draft mutant: top-k drafts verified as i.i.d. draws from the softmax
        rule, mutant = draft_top_k_with_softmax, mutant_top_k_with_draft_softmax
    bad = chi_square_test(_first_two_tokens(target, drafter, parents, rule, mutant, seed=11), law)
    assert bad.p_value < MC_ALPHA, bad


# ----------------------------------------------------------------------------------------------------------------
# Deterministic invariants
# ----------------------------------------------------------------------------------------------------------------


def _random_tree_draft(seed: int, batch: int, nodes: int, vocab: int, scheme=DET, absent_rate=0.2):
    """Random breadth-first trees per row (random parents, some absent nodes), random tokens and q."""
    rng = random.Random(seed)
    parents = [[-1] * (nodes + 1) for _ in range(batch)]
    depths = [[0] * (nodes + 1) for _ in range(batch)]
    for b in range(batch):
        alive, lowest = [0], 0
        for i in range(1, nodes + 1):
            if rng.random() < absent_rate:
                continue
            parent = max(rng.choice(alive), lowest)  # parents never decrease: breadth-first order
            parents[b][i], depths[b][i], lowest = parent, depths[b][parent] + 1, parent
            alive.append(i)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(vocab, (batch, nodes), generator=gen)
    probs = None if scheme == DET else torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), -1)
    return Draft(tokens=tokens, parents=torch.tensor(parents), depths=torch.tensor(depths), draft_probs=probs,
                 scheme=scheme)


def _argmax_chain(target: ToyLM, prefix, length):
    out = []
    for _ in range(length):
        out.append(int(target.probs(tuple(prefix) + tuple(out)).argmax()))
    return out


def test_greedy_verifier_equals_argmax_chain_on_random_trees():
    gen = torch.Generator().manual_seed(0)
    target = ToyLM(5, 3, peakiness=2.0)
    for trial in range(20):
        draft = _random_tree_draft(trial, 6, 7, 5)
        # make most drafts match the argmax at their parent, so that paths of every length get accepted
        lucky = torch.rand(draft.tokens.shape, generator=gen) < 0.7
        parents = draft.parents[:, 1:].clamp_min(0)
        for _ in range(7):  # a node's context depends on its ancestors' tokens: settle level by level
            argmax_at_parent = node_probs(target, (), draft).argmax(-1).gather(1, parents)
            draft = draft._replace(tokens=torch.where(lucky, argmax_at_parent, draft.tokens))
        probs = node_probs(target, (), draft)
        check_draft(draft, 5)
        result = verify_greedy(probs, draft, max_depth=7)
        tokens, counts = emitted_tokens(draft, result)
        for b in range(6):
            emitted = tokens[b, : int(counts[b])].tolist()
            assert emitted == _argmax_chain(target, (), len(emitted))
            # no accepted path is longer: the deepest node matching the argmax chain
            best = max((int(draft.depths[b, i]) for i in range(1, 8) if _matches_chain(draft, probs, b, i)),
                       default=0)
            assert int(counts[b]) == best + 1
        from_logits = verify_greedy(probs.log(), draft, max_depth=7)  # logits give the same answer
        assert all(torch.equal(a, b) for a, b in zip(result, from_logits))


def _matches_chain(draft, probs, b, node):
    while node > 0:
        parent = int(draft.parents[b, node])
        if parent < 0 or int(draft.tokens[b, node - 1]) != int(probs[b, parent].argmax()):
            return False
        node = parent
    return True


def test_greedy_ties_go_to_lowest_id_and_smallest_index():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0] = torch.tensor([1.0, 5.0, 5.0, 0.0])  # argmax at the root: token 1 (tie with 2)
    draft = Draft(tokens=torch.tensor([[1, 1]]), parents=torch.tensor([[-1, 0, 0]]), depths=torch.tensor([[0, 1, 1]]),
                  draft_probs=None, scheme=DET)
    result = verify_greedy(logits, draft)
    assert result.accepted_nodes.tolist() == [[0, 1]] and result.num_accepted.tolist() == [1]
    assert result.next_tokens.tolist() == [0]  # all-zero logits at node 1: lowest id


def test_zero_probability_tokens_are_never_emitted():
    gen = torch.Generator().manual_seed(1)
    vocab = 12
    pairs = [(verify_chain, IID), (verify_chain, DET), (verify_tree_deterministic, DET), (verify_tree_iid, IID),
             (verify_tree_without_replacement, WOR)]
    for seed, (verifier, scheme) in enumerate(pairs):
        draft = _random_tree_draft(seed, 4000, 6, vocab, scheme, absent_rate=0.1)
        if verifier is verify_chain:
            draft = draft._replace(parents=torch.tensor([chain_parents(6)]).expand(4000, -1),
                                   depths=torch.arange(7).expand(4000, -1))
        logits = torch.randn(4000, 7, vocab, generator=gen)
        target_probs = process_logits(logits, SamplingParams(1.0, top_k=3))  # 9 zeros per row
        # one draft in three proposes a token the target forbids
        forbidden = target_probs.gather(1, draft.parents[:, 1:].clamp_min(0)[..., None].expand(-1, -1, vocab)) == 0
        forbidden_token = forbidden.float().argmax(-1)
        tokens = torch.where(torch.rand(draft.tokens.shape, generator=gen) < 0.33, forbidden_token, draft.tokens)
        draft = draft._replace(tokens=tokens)
        result = verifier(target_probs, draft, torch.Generator().manual_seed(2))
        path = result.accepted_nodes
        for depth in range(1, path.shape[1]):
            node = path[:, depth]
            on = node > 0
            parent = draft.parents.gather(1, node.clamp_min(0)[:, None])[:, 0]
            token = draft.tokens.gather(1, (node - 1).clamp_min(0)[:, None])[:, 0]
            p = target_probs[torch.arange(4000), parent.clamp_min(0), token]
            assert bool((p[on] > 0).all()), verifier.__name__
        last = path.gather(1, result.num_accepted[:, None])[:, 0]
        p_next = target_probs[torch.arange(4000), last, result.next_tokens]
        assert bool((p_next > 0).all()), verifier.__name__


def test_recovered_token_lies_in_residual_support():
    gen = torch.Generator().manual_seed(3)
    batch, k, vocab = 20000, 3, 8
    target_probs = torch.softmax(2 * torch.randn(batch, k + 1, vocab, generator=gen), -1)
    draft_probs = torch.softmax(2 * torch.randn(batch, k, vocab, generator=gen), -1)
    source = TorchSource(torch.Generator().manual_seed(4))
    tokens = source.categorical(draft_probs)
    parents = torch.tensor([chain_parents(k)]).expand(batch, -1)
    depths = torch.arange(k + 1).expand(batch, -1)
    rows = torch.arange(batch)
    for scheme in (IID, DET):
        draft = Draft(tokens=tokens, parents=parents, depths=depths,
                      draft_probs=draft_probs if scheme == IID else None, scheme=scheme)
        result = verify_chain(target_probs, draft, source)
        rejected = result.num_accepted < k
        n = result.num_accepted[rejected]
        p = target_probs[rows[rejected], n]
        x = tokens[rows[rejected], n]
        nxt = result.next_tokens[rejected]
        if scheme == IID:
            q = draft_probs[rows[rejected], n]
            assert bool((p[torch.arange(len(n)), nxt] > q[torch.arange(len(n)), nxt]).all())
        else:
            assert bool((nxt != x).all()) and bool((p[torch.arange(len(n)), nxt] > 0).all())
        assert int(rejected.sum()) > 1000  # the check saw many rejections
    # Trees of top-k drafts: the token after rejecting every child is none of the rejected children.
    draft = Draft(tokens=torch.tensor([[0, 1, 2]]).expand(batch, -1),
                  parents=torch.tensor([[-1, 0, 0, 0]]).expand(batch, -1),
                  depths=torch.tensor([[0, 1, 1, 1]]).expand(batch, -1), draft_probs=None, scheme=DET)
    result = verify_tree_deterministic(target_probs, draft, source)
    assert bool((result.next_tokens[result.num_accepted == 0] > 2).all())


def _all_verifier_inputs(gen, batch=8, vocab=50):
    """One (target_probs, draft) per stochastic verifier."""
    out = []
    for seed, (verifier, scheme) in enumerate([(verify_chain, IID), (verify_tree_deterministic, DET),
                                               (verify_tree_iid, IID), (verify_tree_without_replacement, WOR),
                                               (verify_typical, DET)]):
        draft = _random_tree_draft(seed, batch, 6, vocab, scheme)
        if verifier is verify_chain:
            draft = draft._replace(parents=torch.tensor([chain_parents(6)]).expand(batch, -1),
                                   depths=torch.arange(7).expand(batch, -1))
        target_probs = torch.softmax(torch.randn(batch, 7, vocab, generator=gen), -1)
        out.append((verifier, target_probs, draft))
    return out


def test_predrawn_noise_same_noise_gives_same_result_twice():
    gen = torch.Generator().manual_seed(5)
    for verifier, target_probs, draft in _all_verifier_inputs(gen):
        noise = torch.rand(1000, generator=gen, dtype=torch.float64), torch.empty(5000).exponential_(generator=gen)
        first = verifier(target_probs, draft, PredrawnNoise(*noise))
        second = verifier(target_probs, draft, PredrawnNoise(*noise))
        assert all(torch.equal(a, b) for a, b in zip(first, second)), verifier.__name__


class RecordingSource(TorchSource):
    """Draws like TorchSource and keeps the noise, to replay it through PredrawnNoise."""

    def __init__(self, generator):
        super().__init__(generator)
        self.drawn_uniforms, self.drawn_exponentials = [], []

    def uniforms(self, shape, device):
        out = super().uniforms(shape, device)
        self.drawn_uniforms.append(out.reshape(-1))
        return out

    def exponentials(self, shape, device):
        out = super().exponentials(shape, device)
        self.drawn_exponentials.append(out.reshape(-1))
        return out


def test_predrawn_noise_replays_a_generator_exactly():
    gen = torch.Generator().manual_seed(6)
    for verifier, target_probs, draft in _all_verifier_inputs(gen):
        recorder = RecordingSource(torch.Generator().manual_seed(7))
        live = verifier(target_probs, draft, recorder)
        replay = PredrawnNoise(torch.cat(recorder.drawn_uniforms or [torch.zeros(0)]),
                               torch.cat(recorder.drawn_exponentials))
        again = verifier(target_probs, draft, replay)
        assert all(torch.equal(a, b) for a, b in zip(live, again)), verifier.__name__


def test_seeded_generator_gives_identical_results_across_20_repetitions():
    gen = torch.Generator().manual_seed(8)
    for verifier, target_probs, draft in _all_verifier_inputs(gen, batch=8, vocab=300):
        runs = [verifier(target_probs, draft, torch.Generator().manual_seed(1234)) for _ in range(20)]
        assert all(all(torch.equal(a, b) for a, b in zip(runs[0], run)) for run in runs[1:]), verifier.__name__


def test_one_hot_target_accepts_exactly_the_matching_prefix():
    # FlashInfer-style structural check: with a one-hot target every verifier emits the target's tokens.
    vocab, k = 7, 4
    want = torch.tensor([3, 1, 4, 1, 5])
    target_probs = torch.nn.functional.one_hot(want, vocab).double()[None]
    tokens = torch.tensor([[3, 1, 6, 1]])
    parents, depths = torch.tensor([chain_parents(k)]), torch.arange(k + 1)[None]
    q = torch.full((1, k, vocab), 1.0 / vocab)
    for verifier, scheme in [(verify_chain, IID), (verify_chain, DET), (verify_tree_iid, IID),
                             (verify_tree_deterministic, DET), (verify_tree_without_replacement, WOR),
                             (verify_greedy, DET)]:
        draft = Draft(tokens=tokens, parents=parents, depths=depths, draft_probs=None if scheme == DET else q,
                      scheme=scheme)
        result = verifier(target_probs, draft, torch.Generator().manual_seed(0))
        emitted, count = emitted_tokens(draft, result)
        assert emitted.tolist() == [[3, 1, 4, -1, -1]] and count.tolist() == [3], verifier.__name__


# ----------------------------------------------------------------------------------------------------------------
# API: attributes, selection, outputs, errors
# ----------------------------------------------------------------------------------------------------------------


def test_verifier_attributes_state_losslessness_and_exact_schemes():
    assert all(v.lossless for v in LOSSLESS)
    assert verify_tree_deterministic.exact_for == {DET}
    assert verify_tree_iid.exact_for == {IID}
    assert verify_tree_without_replacement.exact_for == {WOR}
    assert verify_chain.exact_for == set(DraftScheme) and verify_greedy.exact_for == set(DraftScheme)


def test_select_verifier_picks_the_exact_verifier_for_each_scheme():
    sampled = SamplingParams(temperature=0.8)
    for scheme in DraftScheme:
        greedy = select_verifier(scheme, SamplingParams())
        assert greedy is kernels.verify_greedy  # dispatches: the Triton kernel on CUDA, verify_greedy elsewhere
        assert greedy.lossless and greedy.takes_logits and greedy.exact_for == verify_greedy.exact_for
        chosen = select_verifier(scheme, sampled)
        assert chosen.lossless and scheme in chosen.exact_for
        assert select_verifier(scheme.value, sampled, chain=True) is verify_chain


def test_emitted_tokens_layout_and_counts():
    draft = Draft(tokens=torch.tensor([[5, 6, 7], [8, 9, 0]]), parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1]]),
                  depths=torch.tensor([[0, 1, 1, 2], [0, 1, 0, 0]]), draft_probs=None, scheme=DET)
    result = VerifyResult(accepted_nodes=torch.tensor([[0, 1, 3], [0, -1, -1]]), num_accepted=torch.tensor([2, 0]),
                          next_tokens=torch.tensor([4, 2]))
    tokens, counts = emitted_tokens(draft, result)
    assert tokens.tolist() == [[5, 7, 4], [2, -1, -1]] and counts.tolist() == [3, 1]


def test_result_layout_padding_and_root_column():
    gen = torch.Generator().manual_seed(9)
    for verifier, target_probs, draft in _all_verifier_inputs(gen):
        result = verifier(target_probs, draft, torch.Generator().manual_seed(0))
        width = draft.max_depth + 1
        assert result.accepted_nodes.shape == (8, width)
        assert bool((result.accepted_nodes[:, 0] == 0).all())
        columns = torch.arange(width)[None]
        filled = result.accepted_nodes >= 0
        assert torch.equal(filled, columns <= result.num_accepted[:, None])
        depth_of_nodes = draft.depths.gather(1, result.accepted_nodes.clamp_min(0))
        assert torch.equal(torch.where(filled, depth_of_nodes, -1), torch.where(filled, columns, -1))


def test_empty_drafts_sample_from_the_root_distribution():
    target_probs = torch.tensor([[[0.0, 0.0, 1.0]]]).expand(3, 1, 3)
    draft = Draft(tokens=torch.zeros(3, 0, dtype=torch.long), parents=torch.full((3, 1), -1),
                  depths=torch.zeros(3, 1, dtype=torch.long), draft_probs=torch.zeros(3, 0, 3), scheme=IID)
    for verifier in [verify_chain, verify_tree_iid, verify_greedy]:
        result = verifier(target_probs, draft, torch.Generator().manual_seed(0))
        assert result.next_tokens.tolist() == [2, 2, 2] and result.num_accepted.tolist() == [0, 0, 0]
        assert result.accepted_nodes.tolist() == [[0], [0], [0]]


@pytest.mark.parametrize("max_depth", [None, 0, 3])
def test_typical_acceptance_on_a_draft_without_nodes_samples_the_whole_root_law(max_depth):
    """A zero-node draft (the last step of a token budget) once crashed verify_typical (an empty argmax)."""
    law = torch.tensor([0.5, 0.45, 0.05])  # token 2 is below the typical threshold min(0.09, 0.3 exp(-H)) = 0.09
    rows = 4000
    target_probs = law.expand(rows, 1, 3)
    empty = Draft(tokens=torch.zeros(rows, 0, dtype=torch.long), parents=torch.full((rows, 1), -1),
                  depths=torch.zeros(rows, 1, dtype=torch.long), draft_probs=None, scheme=DET)
    result = verify_typical(target_probs, empty, torch.Generator().manual_seed(3), max_depth=max_depth)
    width = 1 if max_depth is None else max_depth + 1
    assert result.num_accepted.eq(0).all() and result.accepted_nodes.shape == (rows, width)
    assert result.accepted_nodes[:, 0].eq(0).all() and result.accepted_nodes[:, 1:].eq(-1).all()
    # Plain decoding's draw from the same randomness: the same tokens, the full law (token 2 included).
    plain = TorchSource(torch.Generator().manual_seed(3)).categorical(target_probs[:, 0])
    assert torch.equal(result.next_tokens, plain)
    frequency = torch.bincount(result.next_tokens, minlength=3).double() / rows
    assert float((frequency - law.double()).abs().max()) < 4 * (0.25 / rows) ** 0.5  # 4 sigma of a binomial share
    # The same draft with one present node samples the typical set only: token 2 never appears.
    one = Draft(tokens=torch.ones(rows, 1, dtype=torch.long), parents=torch.tensor([[-1, 0]]).expand(rows, 2),
                depths=torch.tensor([[0, 1]]).expand(rows, 2), draft_probs=None, scheme=DET)
    restricted = verify_typical(torch.stack([law, law], 0).expand(rows, 2, 3), one, torch.Generator().manual_seed(3))
    assert restricted.next_tokens.ne(2).all()


@pytest.mark.parametrize("max_depth", [0, 2])
def test_a_draft_without_nodes_emits_the_next_token(max_depth):
    """emitted_tokens once dropped the next token when the draft had no nodes (then speculative_law never ended)."""
    target_probs = torch.softmax(torch.randn(3, 1, 7, generator=torch.Generator().manual_seed(1)), -1)
    empty = Draft(tokens=torch.zeros(3, 0, dtype=torch.long), parents=torch.full((3, 1), -1),
                  depths=torch.zeros(3, 1, dtype=torch.long), draft_probs=torch.zeros(3, 0, 7), scheme=IID)
    for verifier in LOSSLESS:
        scheme = IID if IID in verifier.exact_for else next(iter(verifier.exact_for))
        draft = empty._replace(scheme=scheme, draft_probs=None if scheme == DET else empty.draft_probs)
        result = verifier(target_probs, draft, torch.Generator().manual_seed(0), max_depth=max_depth)
        tokens, counts = emitted_tokens(draft, result)
        assert tokens.shape == (3, max_depth + 1) and counts.tolist() == [1, 1, 1]
        assert torch.equal(tokens[:, 0], result.next_tokens) and bool((tokens[:, 1:] == -1).all())


@pytest.mark.parametrize("bad_id", [-1, 7])
def test_a_token_id_outside_the_vocabulary_at_a_present_node_is_a_named_error(bad_id):
    V = 7
    target_probs = torch.full((2, 3, V), 1.0 / V)
    tokens = torch.tensor([[1, 2], [3, bad_id]])
    probs = torch.full((2, 2, V), 1.0 / V)
    for verifier, scheme in [(verify_greedy, DET), (verify_chain, IID), (verify_tree_deterministic, DET),
                             (verify_tree_iid, IID), (verify_tree_without_replacement, WOR), (verify_typical, DET)]:
        draft = Draft(tokens=tokens, parents=torch.tensor([[-1, 0, 1]] * 2), depths=torch.tensor([[0, 1, 2]] * 2),
                      draft_probs=None if scheme == DET else probs, scheme=scheme)
        with pytest.raises(ValueError, match=rf"row 1, node 2 holds token id {bad_id}, outside the vocabulary \[0, 7"):
            verifier(target_probs, draft, torch.Generator().manual_seed(0), max_depth=2)
        absent = draft._replace(parents=torch.tensor([[-1, 0, 1], [-1, 0, -1]]),
                                depths=torch.tensor([[0, 1, 2], [0, 1, 0]]))
        verifier(target_probs, absent, torch.Generator().manual_seed(0), max_depth=2)  # an absent node may hold -1


def test_every_verifier_follows_the_one_calling_convention():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(2))
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.7, top_k=3)
    for verifier in LOSSLESS + [verify_typical]:
        assert isinstance(verifier, Verifier)
        assert verifier.takes_logits == (verifier is verify_greedy)
    assert verifier_input(verify_greedy, logits, sampled) is logits  # argmax only: raw logits, no copy
    torch.testing.assert_close(verifier_input(verify_chain, logits, sampled), process_logits(logits, sampled))

    def user_verifier(target_probs, draft, source, *, max_depth=None):  # unmarked: gets probabilities
        return verify_greedy(target_probs, draft, source, max_depth=max_depth)

    torch.testing.assert_close(verifier_input(user_verifier, logits, greedy), process_logits(logits, greedy))


def test_bad_inputs_raise_errors_that_name_the_problem():
    draft = Draft(tokens=torch.tensor([[1]]), parents=torch.tensor([[-1, 0]]), depths=torch.tensor([[0, 1]]),
                  draft_probs=torch.full((1, 1, 5), 0.2), scheme=IID)
    with pytest.raises(ValueError, match="share one vocabulary"):
        verify_tree_iid(torch.full((1, 2, 6), 1 / 6), draft, torch.Generator())
    with pytest.raises(ValueError, match=r"\[B, N \+ 1, V\]"):
        verify_chain(torch.full((1, 3, 5), 0.2), draft, torch.Generator())
    with pytest.raises(ValueError, match="exact for IID drafts only.*select_verifier"):
        verify_tree_iid(torch.full((1, 2, 5), 0.2), draft._replace(scheme=DET), torch.Generator())
    with pytest.raises(ValueError, match="needs draft.draft_probs"):
        verify_tree_iid(torch.full((1, 2, 5), 0.2), draft._replace(draft_probs=None), torch.Generator())
    with pytest.raises(ValueError, match="needs randomness"):
        verify_chain(torch.full((1, 2, 5), 0.2), draft, None)
    with pytest.raises(ValueError, match="parent 2 must come before"):
        check_draft(Draft(tokens=torch.tensor([[1, 2]]), parents=torch.tensor([[-1, 2, 0]]),
                          depths=torch.tensor([[0, 1, 1]]), draft_probs=None, scheme=DET))
    with pytest.raises(ValueError, match="outside"):
        check_draft(draft, vocab_size=1)
    with pytest.raises(ValueError, match="not a chain"):
        check_draft(Draft(tokens=torch.tensor([[1, 2]]), parents=torch.tensor([[-1, 0, 0]]),
                          depths=torch.tensor([[0, 1, 1]]), draft_probs=None, scheme=DET),
                    chain=True)


@pytest.mark.parametrize("max_depth", [0, 2])
def test_verify_greedy_without_drafts_equals_the_general_path(max_depth):
    """The plain-step fast path (no draft nodes) returns what the tree path returns for an absent-only tree."""
    g = torch.Generator().manual_seed(0)
    B, V = 3, 11
    logits = torch.randn(B, 2, V, generator=g)
    z = torch.zeros(B, 1, dtype=torch.long)
    empty = Draft(tokens=z[:, :0], parents=z - 1, depths=z, draft_probs=None, scheme=DraftScheme.DETERMINISTIC)
    absent = Draft(tokens=z.clone(), parents=torch.full((B, 2), -1), depths=torch.zeros(B, 2, dtype=torch.long),
                   draft_probs=None, scheme=DraftScheme.DETERMINISTIC)
    fast = verify_greedy(logits[:, :1], empty, max_depth=max_depth)
    general = verify_greedy(logits, absent, max_depth=max_depth)
    for a, b in zip(fast, general):
        assert torch.equal(a, b)
    assert torch.equal(fast.next_tokens, logits[:, 0].argmax(-1))


def test_as_verifier_calls_functions_of_the_earlier_conventions_the_one_way():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3))
    draft = Draft(tokens=torch.tensor([[1, 2], [3, 4]]), parents=torch.tensor([[-1, 0, 1]] * 2),
                  depths=torch.tensor([[0, 1, 2]] * 2), draft_probs=None, scheme=DET)
    want = verify_greedy(logits, draft, max_depth=2)
    assert as_verifier(verify_greedy) is verify_greedy
    for legacy in [lambda t, d, s: verify_greedy(t, d), lambda t, d: verify_greedy(t, d)]:
        got = as_verifier(legacy)(logits, draft, None, max_depth=2)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(TypeError, match="max_depth=D"):
        as_verifier(lambda t: t)
