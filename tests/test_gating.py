"""Confidence-gated verification (specdec/gating.py) and DSpark-style parallel drafting (LevelOutput, transitions in
specdec/trees/level.py, ParallelDrafter's gate): gate lengths against brute force, truncation against its reference
on ragged batches, transition trees against a per-node reference, rows cut to different lengths in one step, float32
greedy identity with plain decoding (batch 1 and a left-padded batch; chain and tree), and the T > 0 law."""
from __future__ import annotations

import random

import pytest
import torch
from test_generate_sampling import ALPHA, PARAMS, TARGET, TREE, _exact_law, _sampled_counts
from tiny_models import VOCAB, random_forest, tiny_model

from specdec.drafters.base import Feedback, ProposeRequest
from specdec.drafters.parallel import LevelOutput, ParallelDrafter
from specdec.gating import ConfidenceGate, CostAwareGate, accept_prefix_probs, truncate_draft, truncate_draft_ref
from specdec.generate import generate
from specdec.testing import chi_square_test
from specdec.trees import MEDUSA_MC_SIM_7B_63, compile_tree, depths_from_parents
from specdec.trees.level import LevelTree, level_tree_draft, level_tree_draft_ref
from specdec.types import Draft, DraftScheme, SamplingParams
from specdec.verify import check_draft

# --------------------------------------------------------------------------------------------------------
# Gates
# --------------------------------------------------------------------------------------------------------


def _gate_brute_force(c, threshold, min_depth, max_depth):
    out = []
    for row in c.tolist():
        D = len(row)
        upper = D if max_depth is None else min(max_depth, D)
        length, prod = 0, 1.0
        for d in range(D):
            prod *= min(max(row[d], 0.0), 1.0)
            if prod < threshold:
                break
            length = d + 1
        out.append(min(max(length, min(min_depth, upper)), upper))
    return out


@pytest.mark.parametrize("threshold,min_depth,max_depth", [(0.5, 1, None), (0.2, 0, None), (0.7, 2, 4), (0.0, 1, 3),
                                                           (1.0, 0, None)])
def test_confidence_gate_lengths_equal_brute_force(threshold, min_depth, max_depth):
    g = torch.Generator().manual_seed(int(threshold * 10) + min_depth)
    c = torch.rand(64, 6, generator=g) ** 0.3  # mostly high, some low
    c[::7, 2] = 1.0
    lengths = ConfidenceGate(threshold, min_depth, max_depth)(c)
    assert lengths.dtype == torch.long
    assert lengths.tolist() == _gate_brute_force(c.double(), threshold, min_depth, max_depth)


def test_confidence_gate_rows_differ_and_errors_name_the_fix():
    c = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.9, 0.4, 0.9, 0.9], [0.1, 0.9, 0.9, 0.9]])
    assert ConfidenceGate(0.5)(c).tolist() == [4, 1, 1]
    assert ConfidenceGate(0.5, min_depth=0)(c).tolist() == [4, 1, 0]
    assert accept_prefix_probs(c)[1].tolist() == pytest.approx([0.9, 0.36, 0.324, 0.2916])
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        ConfidenceGate(1.5)
    with pytest.raises(ValueError, match="max_depth=None"):
        ConfidenceGate(0.5, min_depth=3, max_depth=2)
    with pytest.raises(ValueError, match=r"\[B, D\]"):
        ConfidenceGate()(torch.rand(4))


@pytest.mark.parametrize("gamma,min_depth,max_depth", [(0.0, 1, None), (0.1, 1, None), (0.5, 0, None), (2.0, 1, 3)])
def test_cost_aware_gate_maximises_modelled_tokens_per_cost(gamma, min_depth, max_depth):
    c = torch.rand(40, 5, generator=torch.Generator().manual_seed(int(gamma * 10)))
    lengths = CostAwareGate(gamma, min_depth, max_depth)(c).tolist()
    for row, got in zip(c.double().tolist(), lengths):
        upper = 5 if max_depth is None else max_depth

        def gain(L, row=row):
            expected, prod = 1.0, 1.0
            for d in range(L):
                prod *= row[d]
                expected += prod
            return expected / (1 + gamma * L)
        best = max(range(min_depth, upper + 1), key=lambda L: (gain(L), -L))
        assert got == best
    assert CostAwareGate(0.0)(c).tolist() == [5] * 40  # free verification: verify everything


# --------------------------------------------------------------------------------------------------------
# Truncation
# --------------------------------------------------------------------------------------------------------


def _random_draft(seed, batch=5, nodes=12, vocab=11, probs=False):
    parents = random_forest(random.Random(seed), batch, nodes)
    depths = depths_from_parents(parents)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, nodes), generator=g)
    draft_probs = torch.softmax(torch.randn(batch, nodes, vocab, generator=g), -1) if probs else None
    return Draft(tokens, parents, depths, draft_probs, DraftScheme.IID if probs else DraftScheme.DETERMINISTIC)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("trim", [False, True])
def test_truncate_draft_equals_reference_on_ragged_batches(seed, trim):
    draft = _random_draft(seed, probs=seed % 2 == 0)
    lengths = torch.randint(0, 5, (draft.tokens.shape[0],), generator=torch.Generator().manual_seed(seed))
    fast, ref = truncate_draft(draft, lengths, trim=trim), truncate_draft_ref(draft, lengths, trim=trim)
    for a, b in zip(fast[:4], ref[:4]):
        assert (a is None and b is None) or torch.equal(a, b)
    check_draft(fast, 11)
    assert fast.scheme is draft.scheme
    kept = fast.num_nodes
    assert torch.equal(fast.tokens, draft.tokens[:, :kept])  # tokens untouched
    if draft.draft_probs is not None:
        assert torch.equal(fast.draft_probs, draft.draft_probs[:, :kept])
    present = fast.parents[:, 1:] >= 0
    assert (fast.depths[:, 1:][present] <= lengths[:, None].expand_as(present)[present]).all()
    # nothing shallow enough was lost
    was = (draft.parents[:, 1:kept + 1] >= 0) & (draft.depths[:, 1:kept + 1] <= lengths[:, None])
    assert torch.equal(present, was)
    if trim:
        assert kept == 0 or present[:, -1].any()


def test_truncate_draft_of_a_chain_and_trim_at_batch_one():
    draft = LevelTree.chain(4).draft(torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(0)))
    cut = truncate_draft(draft, torch.tensor([4, 2]))
    assert cut.parents.tolist() == [[-1, 0, 1, 2, 3], [-1, 0, 1, -1, -1]]
    assert cut.depths.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]]
    one = truncate_draft(Draft(*[t[1:] for t in draft[:3]], None, draft.scheme), torch.tensor([2]), trim=True)
    assert one.num_nodes == 2 and one.parents.tolist() == [[-1, 0, 1]]
    with pytest.raises(ValueError, match="one verify length per row"):
        truncate_draft(draft, torch.tensor([1, 2, 3]))


# --------------------------------------------------------------------------------------------------------
# Transitions (DSpark's Markov head) in level trees
# --------------------------------------------------------------------------------------------------------


def _transition(batch, vocab, levels, seed):
    """A per-row, per-level Markov bias: table[d][x] plus a row term, so a wrong row or level shows."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(levels + 1, vocab, vocab, generator=g) * 2.0
    row = torch.randn(batch, vocab, generator=g)

    def transition(prev, d):
        assert prev.dtype == torch.long and prev.shape[0] == batch and 1 <= d <= levels
        return table[d][prev] + row[:, None, :] * d
    return transition


@pytest.mark.parametrize("tree", [[(0,), (0, 0), (0, 0, 0)], TREE, MEDUSA_MC_SIM_7B_63, [(0,), (1,), (2,), (1, 0)]])
@pytest.mark.parametrize("depth", [1, 2, None])
def test_transition_tree_draft_equals_per_node_reference(tree, depth):
    g = torch.Generator().manual_seed(len(tree) + (depth or 0))
    B, V = 3, 40
    logits = torch.randn(B, 5, V, generator=g)
    roots = torch.randint(0, V, (B,), generator=g)
    transition = _transition(B, V, 5, seed=len(tree))
    fast = level_tree_draft(logits, tree, depth, transition=transition, roots=roots)
    ref = level_tree_draft_ref(logits, tree, depth, transition=transition, roots=roots)
    for a, b in zip(fast[:3], ref[:3]):
        assert torch.equal(a, b)
    assert fast.scheme is DraftScheme.DETERMINISTIC
    check_draft(fast, V)
    policy = LevelTree(tree)
    assert torch.equal(policy.draft(logits, depth, transition=transition, roots=roots).tokens, fast.tokens)
    assert torch.equal(policy.draft(logits, depth).tokens, level_tree_draft(logits, tree, depth).tokens)


def test_a_chain_with_transition_is_a_sequential_argmax_and_children_follow_their_parent():
    B, V = 2, 30
    logits = torch.randn(B, 3, V, generator=torch.Generator().manual_seed(3))
    roots = torch.tensor([4, 7])
    transition = _transition(B, V, 3, seed=9)
    draft = LevelTree.chain(3).draft(logits, transition=transition, roots=roots)
    prev = roots
    for d in range(1, 4):
        expected = (logits[:, d - 1] + transition(prev[:, None], d)[:, 0]).argmax(-1)
        assert torch.equal(draft.tokens[:, d - 1], expected)
        prev = expected
    # a tree: the two children of different level-1 nodes differ because their parents' tokens differ
    tree = compile_tree([(0,), (1,), (0, 0), (1, 0)])
    t = LevelTree(tree).draft(logits, transition=transition, roots=roots).tokens
    for b in range(B):
        for node, parent in ((3, 1), (4, 2)):
            z = logits[b, 1] + transition(t[:, parent - 1, None], 2)[b, 0]
            assert t[b, node - 1] == z.argmax()
    # a zero transition is Medusa's level-wise tree
    zero = LevelTree(tree).draft(logits, transition=lambda prev, d: torch.zeros(*prev.shape, V), roots=roots)
    assert torch.equal(zero.tokens, LevelTree(tree).draft(logits).tokens)


def test_transition_errors_name_the_fix():
    logits = torch.randn(2, 2, 10)
    ok = _transition(2, 10, 2, 0)
    with pytest.raises(ValueError, match="roots=request.roots"):
        LevelTree.chain(2).draft(logits, transition=ok)
    with pytest.raises(ValueError, match=r"\[B, n, V\]"):
        LevelTree.chain(2).draft(logits, transition=lambda prev, d: torch.zeros(2, 10), roots=torch.zeros(2).long())


# --------------------------------------------------------------------------------------------------------
# A toy DSpark-like parallel head: seeded random level logits, a confidence per level, and a Markov transition
# --------------------------------------------------------------------------------------------------------


class ToyMarkovHead(torch.nn.Module):
    """A stateless parallel head for tests. Level logits are a random (seeded) linear map of the target's final
    feature at the last committed token; the confidence is a sigmoid of another such map plus a random term of the
    root token (so rows with the same prompt but different sampled roots get different lengths); the transition is
    ``scale`` times the target's own one-token ("bigram") log-probabilities, so chains of sequential argmaxes are
    accepted fairly often."""

    def __init__(self, target, num_levels=4, seed=0, scale=1.0, noise=0.3):
        super().__init__()
        cfg = target.config
        g = torch.Generator().manual_seed(seed)
        self.feature_layers = (cfg.num_hidden_layers,)
        self.num_levels, self.vocab_size = num_levels, cfg.vocab_size
        self.logit_proj = torch.nn.Parameter(torch.randn(cfg.hidden_size, num_levels * cfg.vocab_size, generator=g)
                                             * noise / cfg.hidden_size ** 0.5)
        self.conf_proj = torch.nn.Parameter(torch.randn(cfg.hidden_size, num_levels, generator=g)
                                            / cfg.hidden_size ** 0.5)
        self.conf_bias = torch.nn.Parameter(torch.linspace(2.0, -1.0, num_levels))
        self.conf_root = torch.nn.Parameter(torch.randn(cfg.vocab_size, num_levels, generator=g) * 3.0)
        with torch.no_grad():
            ids = torch.arange(cfg.vocab_size)[:, None]
            bigram = target(input_ids=ids).logits[:, -1].float().log_softmax(-1)
        self.register_buffer("bigram", bigram * scale)

    def level_logits(self, state, request=None):
        return self.level_outputs(state, request).logits

    def level_outputs(self, state, request=None):
        (feature,) = state
        B = feature.shape[0]
        logits = (feature.float() @ self.logit_proj).view(B, self.num_levels, self.vocab_size)
        root_term = 0.0 if request is None else self.conf_root[request.roots]
        confidence = torch.sigmoid(feature.float() @ self.conf_proj + self.conf_bias + root_term)
        return LevelOutput(logits=logits, confidence=confidence,
                           transition=lambda prev, d: self.bigram[prev])


@pytest.fixture(scope="module")
def target():
    # attention outputs scaled down: a nearly Markov target, so the toy head's bigram transition is often right
    # (tau about 3 ungated) and the gate's cuts decide how much each row can accept
    model = tiny_model("llama", seed=0, scale=4.0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.1)
    return model


class _Recorder:
    """A gate that records the lengths it gives."""

    def __init__(self, gate):
        self.gate, self.trim, self.lengths = gate, getattr(gate, "trim", False), []

    def __call__(self, confidence):
        lengths = self.gate(confidence)
        self.lengths.append(lengths.clone())
        return lengths


def test_rows_get_different_verified_lengths_in_one_step(target):
    head = ToyMarkovHead(target, num_levels=4, seed=1)
    drafter = ParallelDrafter(head, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)],
                              gate=ConfidenceGate(0.5))
    B, M = 8, 3
    feats = torch.randn(B, M, 64, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.randint(0, VOCAB, (B, M), generator=torch.Generator().manual_seed(1))
    state = drafter.start(Feedback(ids, ids, ids, torch.ones(B, M, dtype=torch.bool), (feats,), ids[:, -1]))
    request = ProposeRequest(roots=ids[:, -1], root_positions=torch.full((B,), M), num_drafts=4,
                             sampling=SamplingParams(), source=None, active=torch.ones(B, dtype=torch.bool))
    draft, state = drafter.propose(state, request)
    check_draft(draft, VOCAB)
    out = head.level_outputs((feats[:, -1],), request)
    expected = ConfidenceGate(0.5)(out.confidence)
    row_depth = draft.depths.amax(1)
    assert torch.equal(row_depth, expected) and len(set(row_depth.tolist())) >= 2
    ungated = ParallelDrafter(head, drafter.policy).propose(drafter.start(Feedback(ids, ids, ids, torch.ones(
        B, M, dtype=torch.bool), (feats,), ids[:, -1])), request)[0]
    assert torch.equal(draft.tokens, ungated.tokens) and draft.scheme is DraftScheme.DETERMINISTIC
    assert torch.equal(draft.parents, truncate_draft(ungated, expected).parents)


def test_gate_without_confidence_is_a_named_error(target):
    class NoConfidence(ToyMarkovHead):
        def level_outputs(self, state, request=None):
            return super().level_outputs(state, request)._replace(confidence=None)
    drafter = ParallelDrafter(NoConfidence(target), gate=ConfidenceGate())
    ids = torch.randint(0, VOCAB, (1, 3))
    state = drafter.start(Feedback(ids, ids, ids, torch.ones(1, 3, dtype=torch.bool), (torch.randn(1, 3, 64),),
                                   ids[:, -1]))
    request = ProposeRequest(roots=ids[:, -1], root_positions=torch.tensor([3]), num_drafts=2,
                             sampling=SamplingParams(), source=None, active=torch.ones(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="drop gate="):
        drafter.propose(state, request)
    with pytest.raises(TypeError, match="ConfidenceGate"):
        ParallelDrafter(NoConfidence(target), gate=0.5)


@pytest.mark.parametrize("tree", ["chain", [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)]])
@pytest.mark.parametrize("batch", [1, 3])
def test_gated_greedy_is_token_identical_to_plain_greedy(target, tree, batch):
    ids = torch.randint(1, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[2, :4] = 0
    head = ToyMarkovHead(target, num_levels=4, seed=2, noise=0.1)
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24)
    for gate in (ConfidenceGate(0.5, trim=batch == 1), CostAwareGate(0.2, min_depth=0)):
        recorder = _Recorder(gate)
        drafter = ParallelDrafter(head, None if tree == "chain" else tree, gate=recorder)
        spec = generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24)
        assert torch.equal(spec.sequences, plain.sequences), gate
        assert spec.stats.tau > 1.3, gate
        lengths = torch.cat(recorder.lengths)
        assert lengths.min() < 4 and lengths.max() > 1  # the gate really cut, and not everything


# --------------------------------------------------------------------------------------------------------
# T > 0: the lossless verifier keeps the target's law with the gate on
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree,params_name", [(TREE, "T1"), ("chain", "T1"), (TREE, "T0.7_top_p0.9")])
def test_gated_sampled_law_of_first_tokens_equals_enumerated_target_law(tree, params_name):
    params = PARAMS[params_name]
    head = ToyMarkovHead(TARGET, num_levels=2, seed=1, noise=2.0)
    recorder = _Recorder(ConfidenceGate(0.6))
    drafter = ParallelDrafter(head, None if tree == "chain" else tree, gate=recorder)
    counts = _sampled_counts(drafter, params, seed=41)
    first = recorder.lengths[0]  # the step that drafts x2, x3
    assert first.numel() == sum(counts.values())
    if params_name == "T1":  # rows differ in x1 (the root), hence in confidence: both lengths occur
        assert min((first == 1).sum(), (first == 2).sum()) > 0.01 * first.numel()
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"gated {tree} at {params_name}: {fit}"
