"""Tests of specdec.testing: the enumeration oracle, the toy models and drafting rules, the statistical tests."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from specdec.testing import (
    EnumeratingSource,
    ToyLM,
    chain_parents,
    chi_square_test,
    depths_of,
    detectable_tv,
    draft_iid,
    draft_top_k,
    draft_without_replacement,
    exact_distribution,
    g_test,
    node_probs,
    samples_for_tv,
    speculative_law,
    stack_drafts,
    target_law,
    total_variation,
)
from specdec.types import DraftScheme, VerifyResult
from specdec.verify import verify_greedy, verify_tree_iid

# ----------------------------------------------------------------------------------------------------------------
# EnumeratingSource / exact_distribution
# ----------------------------------------------------------------------------------------------------------------


def test_exact_distribution_of_dependent_coins():
    def program(source):
        first = bool(source.bernoulli(torch.tensor(0.25, dtype=torch.float64)))
        second = bool(source.bernoulli(torch.tensor(0.5 if first else 0.1, dtype=torch.float64)))
        return first, second

    law = exact_distribution(program)
    want = {(True, True): 0.125, (True, False): 0.125, (False, True): 0.075, (False, False): 0.675}
    assert total_variation(law, want) < 1e-15


def test_tensor_calls_branch_over_the_product_of_elements():
    runs = []

    def program(source):
        runs.append(1)
        # only elements 0 and 3 branch
        coins = source.bernoulli(torch.tensor([0.5, 0.0, 1.0, 0.2], dtype=torch.float64))
        picks = source.categorical(torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 2.0]]))  # only row 0 branches
        return coins, picks

    law = exact_distribution(program)
    assert len(runs) == 8 and len(law) == 8
    assert abs(law[((True, False, True, True), (2, 2))] - 0.5 * 0.2 * 0.5) < 1e-15
    assert abs(sum(law.values()) - 1.0) < 1e-15


def test_all_zero_categorical_row_answers_zero_without_branching():
    assert exact_distribution(lambda s: int(s.categorical(torch.zeros(4)))) == {0: 1.0}


def test_enumerating_source_rejects_invalid_probabilities():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        exact_distribution(lambda s: s.bernoulli(torch.tensor([1.5])))
    with pytest.raises(ValueError, match=">= 0"):
        exact_distribution(lambda s: s.categorical(torch.tensor([1.0, -1.0])))


def test_nondeterministic_program_is_detected():
    calls = []

    def program(source):
        calls.append(1)
        width = 3 if len(calls) == 1 else 1  # the second run sees fewer answers than the first: not a function
        return int(source.categorical(torch.ones(width)))

    with pytest.raises(RuntimeError, match="deterministic function of its random answers"):
        exact_distribution(program)


def test_max_runs_guard_names_the_fix():
    with pytest.raises(RuntimeError, match="shrink"):
        exact_distribution(lambda s: s.categorical(torch.ones(3, 5)), max_runs=10)


def test_replayed_choices_reproduce_a_path():
    source = EnumeratingSource((1, 2))
    assert bool(source.bernoulli(torch.tensor(0.3, dtype=torch.float64))) is True
    assert int(source.categorical(torch.tensor([1.0, 1.0, 2.0]))) == 2
    assert abs(source.probability - 0.3 * 0.5) < 1e-15 and source.counts == [2, 3]


def test_enumeration_sees_a_buggy_sampler():
    # A "sampler" that draws from p^2 (normalised) instead of p: the oracle reports its real law.
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    law = exact_distribution(lambda s: int(s.categorical(p * p)))
    assert total_variation(law, {i: float(v) for i, v in enumerate(p)}) > 0.1


# ----------------------------------------------------------------------------------------------------------------
# Toy models, drafting rules, laws
# ----------------------------------------------------------------------------------------------------------------


def test_toy_lm_is_deterministic_float64_and_has_requested_zeros():
    a, b = ToyLM(6, 3), ToyLM(6, 3)
    assert torch.equal(a.probs((1, 2)), b.probs([1, 2])) and a.probs((1, 2)).dtype == torch.float64
    assert not torch.equal(a.probs((1, 2)), a.probs((2, 1)))
    assert not torch.equal(a.probs(()), ToyLM(6, 4).probs(()))
    assert abs(float(a.probs((5,)).sum()) - 1.0) < 1e-15
    assert int((ToyLM(6, 3, top_k=2).probs(()) > 0).sum()) == 2
    assert int((ToyLM(6, 3, top_k=1).probs(()) == 1.0).sum()) == 1
    assert int((ToyLM(6, 3, top_p=0.5).probs(()) > 0).sum()) < 6
    assert float(ToyLM(6, 3, peakiness=0.01).probs(()).max()) < 0.2  # near uniform


def test_probs_batch_matches_probs_and_ignores_padding():
    model = ToyLM(5, 1)
    contexts = torch.tensor([[1, 2, -1], [3, -1, -1], [1, 2, -1], [-1, -1, -1]])
    want = torch.stack([model.probs((1, 2)), model.probs((3,)), model.probs((1, 2)), model.probs(())])
    assert torch.equal(model.probs_batch(contexts), want)
    big = contexts.repeat(40, 1)  # > 64 rows takes the vectorised path
    assert torch.equal(model.probs_batch(big), want.repeat(40, 1))


def test_depths_and_chain_parents():
    assert chain_parents(3) == [-1, 0, 1, 2]
    assert depths_of([-1, 0, 0, 1, 1, 2, 2]) == [0, 1, 1, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="before their children"):
        depths_of([-1, 2, 0])


def test_draft_top_k_takes_the_most_likely_children_in_rank_order():
    model = ToyLM(6, 2)
    draft = draft_top_k(model, (4,), [-1, 0, 0, 1], None)
    order = model.probs((4,)).argsort(descending=True, stable=True)
    assert draft.tokens[0, :2].tolist() == order[:2].tolist()
    assert int(draft.tokens[0, 2]) == int(model.probs((4, int(order[0]))).argmax())
    assert draft.parents.tolist() == [[-1, 0, 0, 1]] and draft.depths.tolist() == [[0, 1, 1, 2]]
    assert draft.draft_probs is None and draft.scheme == DraftScheme.DETERMINISTIC


def test_draft_iid_children_are_independent_draws_from_q():
    model = ToyLM(3, 5)
    q = model.probs(())
    law = exact_distribution(lambda s: tuple(draft_iid(model, (), [-1, 0, 0], s).tokens[0].tolist()))
    want = {(a, b): float(q[a] * q[b]) for a in range(3) for b in range(3)}
    assert total_variation(law, want) < 1e-15
    draft = draft_iid(model, (), [-1, 0, 0], EnumeratingSource())
    assert torch.equal(draft.draft_probs[0, 0], q) and torch.equal(draft.draft_probs[0, 1], q)


def test_draft_without_replacement_removes_earlier_siblings():
    model = ToyLM(3, 6)
    q = model.probs(())
    law = exact_distribution(lambda s: tuple(draft_without_replacement(model, (), [-1, 0, 0], s).tokens[0].tolist()))
    want = {(a, b): float(q[a] * q[b] / (1 - q[a])) for a in range(3) for b in range(3) if a != b}
    assert total_variation(law, want) < 1e-15


def test_draft_without_replacement_marks_siblings_absent_when_support_runs_out():
    model = ToyLM(5, 7, top_k=2)
    draft = draft_without_replacement(model, (), [-1, 0, 0, 0, 3], EnumeratingSource())
    assert draft.parents.tolist() == [[-1, 0, 0, -1, -1]] and draft.depths.tolist() == [[0, 1, 1, 0, 0]]


def test_node_probs_uses_the_path_to_each_node():
    model = ToyLM(4, 8)
    draft = draft_top_k(model, (2,), [-1, 0, 0, 2], None)
    probs = node_probs(model, (2,), draft)
    t = draft.tokens[0].tolist()
    assert torch.equal(probs[0, 0], model.probs((2,)))
    assert torch.equal(probs[0, 3], model.probs((2, t[1], t[2])))


def test_stack_drafts_pads_with_absent_nodes():
    model = ToyLM(4, 9)
    drafts = [draft_iid(model, (), chain_parents(2), EnumeratingSource()), draft_iid(model, (), [-1], None)]
    stacked = stack_drafts(drafts)
    assert stacked.tokens.shape == (2, 2) and stacked.draft_probs.shape == (2, 2, 4)
    assert stacked.parents.tolist() == [[-1, 0, 1], [-1, -1, -1]]
    with pytest.raises(ValueError, match="one scheme"):
        stack_drafts([drafts[0], draft_top_k(model, (), [-1, 0], None)])


def test_target_law_is_the_product_of_conditionals():
    model = ToyLM(3, 10, top_k=2)
    law = target_law(model, 3, prefix=(1,))
    assert abs(sum(law.values()) - 1.0) < 1e-14 and len(law) == 8
    seq = next(iter(law))
    want = math.prod(float(model.probs((1,) + seq[:i])[seq[i]]) for i in range(3))
    assert abs(law[seq] - want) < 1e-15


def test_speculative_law_exposes_a_wrong_verifier():
    target, drafter = ToyLM(3, 11), ToyLM(3, 12)

    def accept_everything(target_probs, draft, source, *, max_depth=None):  # never rejects: the draft's law leaks
        nodes = torch.tensor([[0, 1]])
        return VerifyResult(accepted_nodes=nodes, num_accepted=torch.tensor([1]),
                            next_tokens=source.categorical(target_probs[:, 1]))

    law = speculative_law(target, drafter, 1, draft_iid, accept_everything, 2)
    assert total_variation(law, target_law(target, 2)) > 0.05
    right = speculative_law(target, drafter, 1, draft_iid, verify_tree_iid, 3, max_steps=None)
    assert total_variation(right, target_law(target, 3)) < 1e-12


@pytest.mark.parametrize("rule, verifier", [(draft_iid, verify_tree_iid), (draft_top_k, verify_greedy)])
def test_speculative_law_without_drafts_is_the_target_law(rule, verifier):
    """tree=0: every step emits the next token alone (it once recursed without end: the token was dropped)."""
    target, drafter = ToyLM(3, 21, top_k=0 if verifier is verify_tree_iid else 1), ToyLM(3, 22)
    law = speculative_law(target, drafter, 0, rule, verifier, 3, max_steps=None)
    assert total_variation(law, target_law(target, 3)) < 1e-12


def test_speculative_law_refuses_a_step_that_emits_nothing():
    target, drafter = ToyLM(3, 11), ToyLM(3, 12)

    def emits_nothing(target_probs, draft, source, *, max_depth=None):
        return VerifyResult(accepted_nodes=torch.tensor([[0]]), num_accepted=torch.tensor([0]),
                            next_tokens=torch.tensor([-1]))

    with pytest.raises(ValueError, match="every step must emit"):
        speculative_law(target, drafter, 0, draft_iid, emits_nothing, 2)


def test_total_variation_of_dicts_and_tensors():
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 1.0}) == 0.5
    p = torch.tensor([[0.2, 0.8], [1.0, 0.0]])
    q = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    assert torch.allclose(total_variation(p, q), torch.tensor([0.3, 1.0], dtype=torch.float64))
    with pytest.raises(TypeError, match="two dicts or two tensors"):
        total_variation({"a": 1.0}, torch.ones(1))


# ----------------------------------------------------------------------------------------------------------------
# Goodness-of-fit tests and their power
# ----------------------------------------------------------------------------------------------------------------


def test_chi_square_and_g_match_scipy_without_merging():
    counts = np.array([48, 31, 12, 9])
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    fit = chi_square_test(counts, probs)
    ref = scipy.stats.chisquare(counts, probs * counts.sum())
    assert math.isclose(fit.statistic, ref.statistic, rel_tol=1e-12) and math.isclose(fit.p_value, ref.pvalue)
    g = g_test(counts, probs)
    ref = scipy.stats.power_divergence(counts, probs * counts.sum(), lambda_="log-likelihood")
    assert math.isclose(g.statistic, ref.statistic, rel_tol=1e-12) and math.isclose(g.p_value, ref.pvalue)
    assert fit.dof == g.dof == 3


def test_small_bins_are_merged_and_impossible_outcomes_fail():
    probs = {"a": 0.9, "b": 0.05, "c": 0.03, "d": 0.02}
    fit = chi_square_test({"a": 91, "b": 5, "c": 2, "d": 2}, probs)  # expected 90, 5, 3, 2 -> c and d pooled
    assert fit.num_bins == 3 and fit.dof == 2
    impossible = chi_square_test({"a": 99, "z": 1}, {"a": 1.0})
    assert impossible.statistic == math.inf and impossible.p_value == 0.0
    with pytest.raises(ValueError, match="distribution"):
        chi_square_test([1, 2], [0.5, 0.6])


def test_chi_square_is_calibrated_under_the_null():
    rng = np.random.default_rng(0)
    probs = np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    p_values = [chi_square_test(rng.multinomial(2000, probs), probs).p_value for _ in range(400)]
    assert 0.02 < np.mean(np.array(p_values) < 0.05) < 0.09


@pytest.mark.parametrize("shape", ["two_point", "spread"])
def test_detectable_tv_power_statement_holds_by_simulation(shape):
    # Every alternative at TV >= detectable_tv(n, bins) is rejected at alpha with probability >= power.
    n, bins, alpha, power = 5000, 10, 1e-3, 0.99
    d = detectable_tv(n, bins, alpha, power)
    probs = np.full(bins, 1.0 / bins)
    shift = np.zeros(bins)
    if shape == "two_point":
        shift[0], shift[1] = d, -d
    else:
        shift[:5], shift[5:] = d / 5, -d / 5
    rng = np.random.default_rng(1)
    rejections = [chi_square_test(rng.multinomial(n, probs + shift), probs).p_value < alpha for _ in range(300)]
    assert np.mean(rejections) >= 0.96  # 0.99 claimed; 300 trials leave binomial slack


def test_samples_for_tv_inverts_detectable_tv():
    n = samples_for_tv(0.01, 36, 1e-3, 0.99)
    assert detectable_tv(n, 36) <= 0.01 < detectable_tv(n - 50, 36)
    assert detectable_tv(4 * n, 36) == pytest.approx(detectable_tv(n, 36) / 2, rel=1e-3)
    with pytest.raises(ValueError, match="at least 2 bins"):
        detectable_tv(100, 1)
    with pytest.raises(ValueError, match="alpha < power"):
        detectable_tv(100, 5, alpha=0.5, power=0.4)
