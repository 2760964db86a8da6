"""Optimised static trees (specdec/trees/optimize.py): the greedy and the DP against brute force, the counting of
per-depth / per-rank hits, and measurement with real drafters (Medusa level trees and EAGLE-1 static trees)."""
from __future__ import annotations

import random

import pytest
import torch
from tiny_models import tiny_model

from specdec import recipes
from specdec.heads import Eagle1Head
from specdec.heads.medusa import MedusaHead
from specdec.trees import MEDUSA_MC_SIM_7B_63, compile_tree
from specdec.trees.optimize import (
    RankAcceptance,
    comb_tree,
    count_rank_hits,
    expected_accept_length,
    measure_rank_acceptance,
    optimal_tree,
    sequoia_tree,
)
from specdec.types import Draft, DraftScheme


def _all_valid_trees(depth: int, ranks: int, max_nodes: int):
    """Every tree (closed under parents and earlier siblings) with at most max_nodes nodes, by exhaustive
    recursion: a node has k = 0..ranks children (ranks 0..k-1), and the budget is split among them every way."""

    def forests(level: int, budget: int):
        # all child forests of one node at depth level - 1, as tuples of relative paths, using <= budget nodes
        yield ()
        if level > depth:
            return
        for k in range(1, min(ranks, budget) + 1):
            yield from children(level, k, 0, budget - k)

    def children(level: int, k: int, j: int, budget: int):
        if j == k:
            yield ()
            return
        for sub in forests(level + 1, budget):
            for rest in children(level, k, j + 1, budget - len(sub)):
                yield ((j,),) + tuple((j,) + p for p in sub) + rest

    return [tuple(sorted(t, key=lambda p: (len(p), p))) for t in forests(1, max_nodes)]


def _value(tree, a):
    return expected_accept_length(tree, a) - 1.0 if tree else 0.0


def _monotone_table(rng, depth, ranks):
    rows = []
    for _ in range(depth):
        row = sorted((rng.random() for _ in range(ranks)), reverse=True)
        total = sum(row)
        rows.append([x / max(total, 1.0) for x in row])  # a distribution over ranks (at most one is right)
    return rows


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [1, 3, 5])
def test_greedy_equals_brute_force_for_rank_decreasing_acceptance(seed, budget):
    rng = random.Random(seed)
    a = _monotone_table(rng, 3, 3)
    trees = _all_valid_trees(3, 3, budget)
    assert all(len(t) <= budget for t in trees) and len(set(trees)) == len(trees)
    best = max(_value(t, a) for t in trees)
    greedy = optimal_tree(a, budget)
    assert len(greedy) == budget
    compile_tree(greedy)  # a valid tree
    assert _value(greedy, a) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("budget", [2, 4, 6])
def test_sequoia_dp_equals_brute_force_for_any_acceptance(seed, budget):
    rng = random.Random(100 + seed)
    a = [[rng.random() * 0.6 for _ in range(3)] for _ in range(3)]  # not monotone in rank
    trees = _all_valid_trees(3, 3, budget)
    best = max(_value(t, a) for t in trees)
    dp = sequoia_tree(a, budget)
    assert len(dp) <= budget
    compile_tree(dp)
    assert _value(dp, a) == pytest.approx(best, abs=1e-12)
    assert _value(optimal_tree(a, budget), a) <= best + 1e-12


def test_greedy_can_lose_to_the_dp_when_acceptance_increases_with_rank():
    a = [[0.1, 0.9], [0.0, 0.0]]  # rank 1 is better than rank 0, but needs rank 0 first
    assert _value(optimal_tree(a, 2), a) <= _value(sequoia_tree(a, 2), a)
    assert sequoia_tree(a, 2) == ((0,), (1,))


def test_greedy_follows_medusas_order_and_respects_bounds():
    a = [[0.5, 0.3, 0.1], [0.4, 0.2, 0.1]]
    tree = optimal_tree(a, 20)
    assert tree[:3] == ((0,), (1,), (0, 0))  # values 0.5, 0.3, 0.2
    assert len(tree) == 3 + 9  # the full 3-ary tree of depth 2 is smaller than the budget
    assert max(len(p) for p in optimal_tree(a, 5, max_depth=1)) == 1


def test_expected_accept_length_of_the_chain_is_the_sum_of_prefix_products():
    a = [[0.8, 0.1], [0.5, 0.1], [0.5, 0.1]]
    assert expected_accept_length([(0,), (0, 0), (0, 0, 0)], a) == pytest.approx(1 + 0.8 + 0.4 + 0.2)


def test_bad_acceptance_tables_and_budgets_are_refused():
    with pytest.raises(ValueError, match=r"\[D, R\]"):
        optimal_tree(torch.ones(3), 4)
    with pytest.raises(ValueError, match="probabilities"):
        optimal_tree([[1.5]], 4)
    with pytest.raises(ValueError, match="num_nodes"):
        sequoia_tree([[0.5]], 0)


def test_comb_tree_is_the_top1_path_with_every_rank():
    tree = compile_tree(comb_tree(3, 4))
    assert tree.num_nodes == 12 and tree.num_drafts_per_level == (4, 4, 4)


def test_count_rank_hits_on_a_hand_built_step():
    # Tree: root -> a (rank 0), b (rank 1); a -> c (rank 0), d (rank 1). Target greedy: root -> 5, 5 -> 7.
    V = 10
    parents = torch.tensor([[-1, 0, 0, 1, 1]])
    depths = torch.tensor([[0, 1, 1, 2, 2]])
    tokens = torch.tensor([[4, 5, 8, 7]])  # a=4 (miss), b=5 (hit); c, d under a (parent wrong: not tried)
    logits = torch.zeros(1, 5, V)
    logits[0, 0, 5] = 1  # after root: 5
    logits[0, 2, 7] = 1  # after b: 7 (b has no children drafted)
    draft = Draft(tokens, parents, depths, None, DraftScheme.DETERMINISTIC)
    hits, tries = count_rank_hits(logits, draft, num_levels=2, num_ranks=2)
    assert tries.tolist() == [[1, 1], [0, 0]]
    assert hits.tolist() == [[0, 1], [0, 0]]
    # now a = 5 (hit) so its children are tried: c = 8 misses, d = 7 hits (target after a: 7)
    logits[0, 1, 7] = 1
    draft = Draft(torch.tensor([[5, 3, 8, 7]]), parents, depths, None, DraftScheme.DETERMINISTIC)
    hits, tries = count_rank_hits(logits, draft, num_levels=2, num_ranks=2)
    assert tries.tolist() == [[1, 1], [1, 1]]
    assert hits.tolist() == [[1, 0], [0, 1]]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=3, scale=4.0)


def _prompts(n, seed=0, length=10):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (1, length), generator=g) for _ in range(n)]


def test_measured_medusa_acceptance_is_each_heads_top_k_accuracy(target):
    torch.manual_seed(0)
    head = MedusaHead.from_target(target, num_heads=3)
    acc = measure_rank_acceptance(target, lambda t: recipes.medusa(head, t), _prompts(3), num_levels=3,
                                  num_ranks=4, max_new_tokens=12)
    assert isinstance(acc, RankAcceptance) and acc.probs.shape == (3, 4) and acc.num_steps > 0
    assert bool((acc.hits <= acc.tries).all()) and int(acc.tries[0, 0]) == acc.num_steps  # depth 1 always tried
    # in the comb probe every rank of a depth hangs under the same parent, so each is tried equally often, and at
    # most one candidate of a depth can be the target's token
    assert bool((acc.tries == acc.tries[:, :1]).all())
    assert bool((acc.probs.sum(1) <= 1 + 1e-12).all())


def test_measurement_then_optimisation_works_for_eagle1_static_trees(target):
    torch.manual_seed(1)
    head = Eagle1Head.from_target(target)
    acc = measure_rank_acceptance(target, lambda t: recipes.eagle1(head, tree=t, cuda_graphs=False), _prompts(2, 1),
                                  num_levels=2, num_ranks=3, max_new_tokens=10)
    tree = optimal_tree(acc, 5)
    assert len(tree) == 5
    drafter = recipes.eagle1(head, tree=tree, cuda_graphs=False)
    assert drafter.max_num_drafts == max(len(p) for p in tree)


def test_optimal_tree_at_medusas_budget_is_a_valid_63_node_tree():
    rng = random.Random(7)
    a = _monotone_table(rng, 4, 10)
    tree = compile_tree(optimal_tree(a, len(MEDUSA_MC_SIM_7B_63)))
    assert tree.num_nodes == 63 and tree.max_depth <= 4
    assert expected_accept_length(tree, a) >= expected_accept_length(MEDUSA_MC_SIM_7B_63, a) - 1e-12


class _OracleHead:
    """A stateful parallel head that knows the target's greedy continuation: level d's logits put the true token
    d positions after the root first and a fixed wrong token second. Its start / update hooks track the root's
    position from the feedback (checked against the request in level_logits)."""

    def __init__(self, continuation: list, prompt_len: int, num_levels: int, vocab: int):
        self.continuation, self.prompt_len = continuation, prompt_len
        self.num_levels, self.vocab_size, self.feature_layers = num_levels, vocab, ()
        self.calls = {"start": 0, "update": 0}

    def _root(self, feedback, previous):
        valid = feedback.valid[0]
        if not bool(valid.any()):
            return previous
        return int(feedback.positions[0][valid].max()) + 1

    def start(self, feedback):
        self.calls["start"] += 1
        return self._root(feedback, None)

    def update(self, state, feedback):
        self.calls["update"] += 1
        return self._root(feedback, state)

    def level_logits(self, state, request):
        assert state == int(request.root_positions[0])
        logits = torch.zeros(1, self.num_levels, self.vocab_size)
        for d in range(1, self.num_levels + 1):
            j = state + d - self.prompt_len
            true = self.continuation[j] if j < len(self.continuation) else 0
            logits[0, d - 1, true] = 2.0
            logits[0, d - 1, (true + 1) % self.vocab_size] = 1.0
        return logits


@pytest.mark.parametrize("mode", ["prefix", "continuation"])
def test_an_oracle_parallel_head_measures_rank_zero_always_right(target, mode):
    from specdec.drafters.parallel import ParallelDrafter
    from specdec.generate import generate

    prompt = _prompts(1, 9)[0]
    continuation = generate(target, prompt, max_new_tokens=30, eos_token_id=[]).sequences[0, prompt.shape[1]:].tolist()
    oracle = _OracleHead(continuation, prompt.shape[1], 3, 97)
    acc = measure_rank_acceptance(target, lambda t: ParallelDrafter(oracle, t), [prompt], num_levels=3, num_ranks=2,
                                  max_new_tokens=24, eos_token_id=[], mode=mode)
    assert oracle.calls["start"] == 1 and oracle.calls["update"] == acc.num_steps
    assert acc.probs[:, 0].tolist() == [1.0, 1.0, 1.0] and acc.probs[:, 1].tolist() == [0.0, 0.0, 0.0]
    out = generate(target, prompt, drafter=ParallelDrafter(oracle, [(0,), (0, 0), (0, 0, 0)]), max_new_tokens=24,
                   eos_token_id=[])
    assert out.sequences[0, prompt.shape[1]:].tolist() == continuation[:24]
    assert out.stats.acceptance_per_depth == (1.0, 1.0, 1.0)  # every draft accepted (the budget trims the last)


def test_continuation_mode_counts_every_step_at_every_reachable_depth(target):
    torch.manual_seed(0)
    head = MedusaHead.from_target(target, num_heads=2)
    acc = measure_rank_acceptance(target, lambda t: recipes.medusa(head, t), _prompts(2, 4), num_levels=2,
                                  num_ranks=3, max_new_tokens=10, mode="continuation")
    assert bool((acc.tries == acc.tries[:, :1]).all()) and int(acc.tries[0, 0]) >= acc.num_steps - 2
    with pytest.raises(ValueError, match="mode"):
        measure_rank_acceptance(target, lambda t: recipes.medusa(head, t), _prompts(1), num_levels=2, mode="both")
