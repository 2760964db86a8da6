"""Medusa drafting (specdec/trees/level.py, specdec/drafters/parallel.py, the Medusa recipes): level-wise trees
against their reference, the drafter over ragged batches, float32 greedy identity with plain decoding (batch 1 and a
left-padded batch; chain and tree; two architectures), the sampling law at T > 0 with the lossless verifier, and
typical acceptance (its rule; greedy as T -> 0; lossy)."""
from __future__ import annotations

import math

import pytest
import torch
from test_generate_sampling import ALPHA, PARAMS, TARGET, TREE, _exact_law, _sampled_counts
from tiny_models import VOCAB, tiny_model

from specdec import recipes
from specdec.drafters.base import Feedback, ProposeRequest
from specdec.drafters.parallel import ParallelDrafter, ParallelState, last_committed_features
from specdec.generate import generate
from specdec.heads.medusa import MedusaHead
from specdec.sampling import TorchSource, process_logits
from specdec.testing import chi_square_test
from specdec.training.medusa import train_medusa1
from specdec.trees import MEDUSA_MC_SIM_7B_63, compile_tree
from specdec.trees.level import LevelTree, level_tree_draft, level_tree_draft_ref
from specdec.types import Draft, DraftScheme, SamplingParams
from specdec.verify import check_draft, verify_greedy, verify_typical

# --------------------------------------------------------------------------------------------------------
# Level-wise trees
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [MEDUSA_MC_SIM_7B_63, [(0,), (0, 0), (0, 0, 0)], TREE, [(0,), (1,), (2,), (1, 0)]])
@pytest.mark.parametrize("depth", [1, 2, None])
def test_level_tree_draft_equals_reference(tree, depth):
    g = torch.Generator().manual_seed(len(tree) + (depth or 0))
    logits = torch.randn(3, 5, 40, generator=g)
    fast = level_tree_draft(logits, tree, depth)
    ref = level_tree_draft_ref(logits, tree, depth)
    for a, b in zip(fast[:3], ref[:3]):
        assert torch.equal(a, b)
    assert fast.scheme is DraftScheme.DETERMINISTIC and fast.draft_probs is None
    check_draft(fast, 40)
    pruned = compile_tree(tree).prune(depth or 99)
    assert fast.num_nodes == pruned.num_nodes
    assert torch.equal(LevelTree(tree).draft(logits, depth).tokens, fast.tokens)


def test_a_fresh_level_tree_drafts_inside_dynamo_without_a_graph_break():
    # (fast="compile" traces the drafter's first call, where the tree's index plans are built: from host data)
    torch._dynamo.reset()
    logits = torch.randn(2, 4, 30, generator=torch.Generator().manual_seed(2))
    for transition in (None, lambda prev, d: torch.zeros(*prev.shape, 30)):
        tree = LevelTree([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])
        roots = torch.tensor([3, 4]) if transition else None

        def draft(z, tree=tree, transition=transition, roots=roots):
            return tree.draft(z, 3, transition=transition, roots=roots).tokens

        explained = torch._dynamo.explain(draft)(logits)
        assert explained.graph_break_count == 0, explained.break_reasons


def test_a_node_takes_its_levels_rank_whatever_its_parent():
    logits = torch.randn(1, 2, 30, generator=torch.Generator().manual_seed(0))
    tree = compile_tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)])
    draft = LevelTree(tree).draft(logits)
    top = logits[0].topk(2, -1).indices
    token = {path: int(draft.tokens[0, i]) for i, path in enumerate(tree.choices)}
    assert token[(0,)] == top[0, 0] and token[(1,)] == top[0, 1]
    assert token[(0, 0)] == token[(1, 0)] == top[1, 0] and token[(0, 1)] == token[(1, 1)] == top[1, 1]


def test_chain_is_every_levels_top1():
    logits = torch.randn(2, 4, 30, generator=torch.Generator().manual_seed(1))
    draft = LevelTree.chain(4).draft(logits, 3)
    assert torch.equal(draft.tokens, logits[:, :3].argmax(-1))
    assert draft.parents[0].tolist() == [-1, 0, 1, 2]


def test_level_tree_errors_name_the_fix():
    with pytest.raises(ValueError, match="prune"):
        level_tree_draft(torch.randn(1, 2, 30), MEDUSA_MC_SIM_7B_63)  # depth 4 tree, 2 levels
    with pytest.raises(ValueError, match=r"\[B, D, V\]"):
        level_tree_draft(torch.randn(2, 30), [(0,)])
    with pytest.raises(ValueError, match="rank 9"):
        level_tree_draft(torch.randn(1, 1, 5), [(r,) for r in range(10)])


# --------------------------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=4.0)


def _self_distilled(model, seed=5, rows=32):
    prompts = torch.randint(1, VOCAB, (rows, 3), generator=torch.Generator().manual_seed(seed))
    return generate(model, prompts, max_new_tokens=40, eos_token_id=[]).sequences  # the target's own text


@pytest.fixture(scope="module")
def head(target):
    return train_medusa1(target, _self_distilled(target), num_heads=4, steps=100, batch_size=8, seq_len=24, lr=1e-2,
                         labels="target", progress=False).head


def test_last_committed_features_pick_each_rows_last_valid_entry_and_keep_finished_rows():
    feats = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    valid = torch.tensor([[True, True, False], [False, False, False]])
    z = torch.zeros(2, 3, dtype=torch.long)
    fb = Feedback(z, z, z, valid, (feats,), z[:, 0])
    previous = (torch.full((2, 2), -1.0),)
    (picked,) = last_committed_features(fb, previous)
    assert picked[0].tolist() == feats[0, 1].tolist() and picked[1].tolist() == [-1.0, -1.0]


def test_drafter_protocol_over_ragged_rows(target, head):
    drafter = recipes.medusa(head, "mc_sim_7b_63")
    assert drafter.max_num_drafts == 4 and drafter.feature_layers == (2,) and drafter.vocab_size == VOCAB
    B, M = 2, 5
    feats = torch.randn(B, M, 64, generator=torch.Generator().manual_seed(0))
    valid = torch.ones(B, M, dtype=torch.bool)
    valid[1, :2] = False  # left padding
    ids = torch.randint(0, VOCAB, (B, M), generator=torch.Generator().manual_seed(1))
    state = drafter.start(Feedback(ids, ids, ids, valid, (feats,), ids[:, -1]))
    assert isinstance(state, ParallelState) and torch.equal(state.head_state[0], feats[:, -1])
    request = ProposeRequest(roots=ids[:, -1], root_positions=torch.tensor([5, 3]), num_drafts=2,
                             sampling=SamplingParams(), source=None, active=torch.ones(B, dtype=torch.bool))
    draft, state = drafter.propose(state, request)
    check_draft(draft, VOCAB)
    assert draft.max_depth == 2 and state.num_forwards == 1  # K prunes the tree
    expected = level_tree_draft(head(feats[:, -1]), MEDUSA_MC_SIM_7B_63, 2)
    assert torch.equal(draft.tokens, expected.tokens)


def test_drafter_refuses_a_tree_deeper_than_the_head(head):
    with pytest.raises(ValueError, match="4 levels deep but the head predicts 3|prune"):
        ParallelDrafter(MedusaHead.from_target(tiny_model("llama", seed=1), num_heads=3), MEDUSA_MC_SIM_7B_63)
    with pytest.raises(TypeError, match="parallel head"):
        ParallelDrafter(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown Medusa tree"):
        recipes.medusa(head, "no_such_tree")


# --------------------------------------------------------------------------------------------------------
# Greedy identity with plain decoding (float32)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["chain", "mc_sim_7b_63"])
@pytest.mark.parametrize("batch", [1, 3])
def test_generate_greedy_is_token_identical_to_plain_greedy(target, head, tree, batch):
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, VOCAB, (batch, 6), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[2, :4] = 0
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24)
    spec = generate(target, ids, attention_mask=mask, drafter=recipes.medusa(head, tree), max_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.tau > 1.0 and spec.stats.num_target_forwards < plain.stats.num_target_forwards
    if batch == 1:  # one head call per drafting step (the last step may be a plain one: no room left to draft)
        assert spec.stats.num_draft_forwards == spec.stats.depth_tries[0] >= spec.stats.num_steps - 1


def test_greedy_identity_on_another_architecture_with_shared_lm_head_heads():
    model = tiny_model("qwen2", seed=2, scale=4.0)
    head = train_medusa1(model, _self_distilled(model, 6), num_heads=3, shared_lm_head=True, steps=40,
                         batch_size=8, seq_len=24, lr=3e-3, progress=False).head
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(9))
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=20)
    spec = generate(model, ids, attention_mask=mask, drafter=recipes.medusa(head, [(0,), (1,), (0, 0), (0, 0, 0)]),
                    max_new_tokens=20)
    assert torch.equal(spec.sequences, plain.sequences)


# --------------------------------------------------------------------------------------------------------
# T > 0: the lossless verifier keeps the target's law (the harness of test_generate_sampling.py)
# --------------------------------------------------------------------------------------------------------


def _law_head():
    head = MedusaHead.from_target(TARGET, num_heads=2)
    g = torch.Generator().manual_seed(21)
    with torch.no_grad():  # random blocks: partial acceptance at both depths
        head.block_weight.copy_(torch.randn(head.block_weight.shape, generator=g) * 0.6)
    return head


@pytest.mark.parametrize("tree,params_name", [(TREE, "T1"), ("chain", "T0.7_top_p0.9")])
def test_sampled_law_of_first_tokens_equals_enumerated_target_law(tree, params_name):
    params = PARAMS[params_name]
    drafter = recipes.medusa(_law_head(), tree)
    counts = _sampled_counts(drafter, params, seed=31)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"medusa {tree} at {params_name}: {fit}"


def test_typical_acceptance_is_detectably_lossy_at_temperature_one():
    params = PARAMS["T1"]
    recipe = recipes.medusa_typical(_law_head(), TREE)  # the authors' defaults: epsilon 0.09, alpha 0.3
    counts = _sampled_counts(recipe.drafter, params, seed=32, verifier=recipe.verifier)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value < ALPHA, f"typical acceptance matched the target's law: {fit}"
    assert recipe.verifier.lossless is False and recipe.verifier.exact_for == frozenset()


# --------------------------------------------------------------------------------------------------------
# Typical acceptance: the rule, greedy at T = 0 and as T -> 0
# --------------------------------------------------------------------------------------------------------


def test_typical_verifier_applies_its_documented_rule():
    # root -> a (p=0.5, typical), b (p=0.04: below min(eps, alpha * exp(-H)) = 0.09); a -> c
    p_root = torch.tensor([0.5, 0.04, 0.3, 0.1, 0.06])
    p_a = torch.tensor([0.02, 0.9, 0.04, 0.02, 0.02])
    target_probs = torch.stack([p_root, p_a, p_root])[None]                           # nodes: root, a, b
    draft = Draft(torch.tensor([[0, 1]]), torch.tensor([[-1, 0, 0]]), torch.tensor([[0, 1, 1]]), None,
                  DraftScheme.DETERMINISTIC)
    entropy = -(p_root * p_root.log()).sum()
    threshold = min(0.09, 0.3 * math.exp(-float(entropy)))
    assert float(p_root[0]) > threshold > float(p_root[1])  # the rule accepts a and rejects b
    verifier = recipes.typical_acceptance(0.09, 0.3)
    result = verifier(target_probs, draft, TorchSource(torch.Generator().manual_seed(0)))
    assert result.num_accepted.tolist() == [1] and result.accepted_nodes[0, :2].tolist() == [0, 1]
    # the next token is drawn from a's distribution restricted to its typical tokens: here only token 1 survives
    assert result.next_tokens.tolist() == [1]
    same = verify_typical(target_probs, draft, TorchSource(torch.Generator().manual_seed(0)))
    assert torch.equal(result.accepted_nodes, same.accepted_nodes)


def test_typical_verifier_is_greedy_verification_at_temperature_zero():
    logits = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(3))
    draft = level_tree_draft(torch.randn(2, 2, 7, generator=torch.Generator().manual_seed(4)), [(0,), (1,), (0, 0)])
    a, b = recipes.typical_acceptance()(logits, draft), verify_greedy(logits, draft)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_typical_decoding_equals_greedy_decoding_as_temperature_goes_to_zero(target, head):
    ids = torch.randint(1, VOCAB, (3, 6), generator=torch.Generator().manual_seed(8))
    plain = generate(target, ids, max_new_tokens=20)
    recipe = recipes.medusa_typical(head, "mc_sim_7b_63")
    cold = generate(target, ids, max_new_tokens=20, temperature=1e-4, generator=torch.Generator().manual_seed(0),
                    **recipe._asdict())
    assert torch.equal(cold.sequences, plain.sequences)
    assert cold.stats.tau > 1.0
    # and at T = 1 it accepts at least as long a prefix as the argmax match would on the same steps' drafts
    assert process_logits(torch.tensor([[3.0, 1.0]]), SamplingParams(1e-4)).max() == 1.0


# --------------------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_with_autocast_and_greedy_identity():
    model = tiny_model("llama", seed=0, scale=4.0)
    text = _self_distilled(model).cuda()  # the target's own text, generated on the CPU
    model = model.cuda()
    head = train_medusa1(model, text, num_heads=4, steps=40, batch_size=8, seq_len=24,
                         lr=1e-2, labels="target", progress=False).head
    assert head.device.type == "cuda" and head.dtype == torch.float32
    ids = torch.randint(1, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=24)
    for tree in ("chain", "mc_sim_7b_63"):
        spec = generate(model, ids, attention_mask=mask, drafter=recipes.medusa(head, tree), max_new_tokens=24)
        assert torch.equal(spec.sequences, plain.sequences)
