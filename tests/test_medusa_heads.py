"""Medusa heads (specdec/heads/medusa.py): the residual-block maths, the fast path against its reference, the two
layouts of the vocabulary projection, and the initialisation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import VOCAB, tiny_model

from specdec.heads.medusa import MedusaConfig, MedusaHead, medusa_target_dims


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


def _randomise(head, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return head


def test_fresh_head_predicts_the_targets_next_token_distribution_at_every_level(target):
    head = MedusaHead.from_target(target, num_heads=3)
    feats = torch.randn(2, 5, 64)
    logits = head(feats)
    assert logits.shape == (2, 5, 3, VOCAB)
    expected = target.get_output_embeddings()(feats)
    for k in range(3):  # zero blocks are the identity, projections are copies of lm_head
        assert torch.allclose(logits[..., k, :], expected, atol=1e-5)
    assert head.feature_layers == (target.config.num_hidden_layers,)
    assert head.num_levels == 3 and head.vocab_size == VOCAB


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("layers,bias", [(1, True), (2, False)])
def test_fast_batched_heads_equal_the_per_head_reference(target, shared, layers, bias):
    head = MedusaHead.from_target(target, num_heads=4, num_layers=layers, shared_lm_head=shared, bias=bias)
    _randomise(head, seed=layers)
    feats = torch.randn(3, 7, 64)
    assert torch.allclose(head(feats), head.forward_ref(feats), atol=1e-5)
    for k in range(4):
        assert torch.allclose(head.head_logits(feats, k), head.forward_ref(feats)[..., k, :], atol=1e-5)


def test_residual_block_maths_by_hand(target):
    head = _randomise(MedusaHead.from_target(target, num_heads=2, num_layers=2), seed=3)
    f = torch.randn(64)
    k = 1
    x = f
    for layer in range(2):
        x = x + F.silu(head.block_weight[k, layer] @ x + head.block_bias[k, layer])
    assert torch.allclose(head(f)[k], head.lm_head_weight[k] @ x, atol=1e-5)


def test_shared_layout_reuses_the_targets_lm_head_without_saving_it(target):
    head = MedusaHead.from_target(target, num_heads=3, shared_lm_head=True)
    assert head.lm_head_weight.data_ptr() == target.get_output_embeddings().weight.data_ptr()
    assert set(head.state_dict()) == {"block_weight", "block_bias"}
    assert sum(p.numel() for p in head.parameters()) == 3 * (64 * 64 + 64)
    own = MedusaHead.from_target(target, num_heads=3)
    assert set(own.state_dict()) == {"block_weight", "block_bias", "lm_head_weight"}


def test_level_logits_are_the_heads_at_the_given_features(target):
    head = _randomise(MedusaHead.from_target(target, num_heads=3), seed=4)
    feats = torch.randn(2, 64)
    assert torch.equal(head.level_logits((feats,)), head(feats))


def test_bad_sizes_are_refused(target):
    head = MedusaHead.from_target(target, num_heads=2)
    with pytest.raises(ValueError, match="hidden size of 64"):
        head(torch.randn(2, 32))
    with pytest.raises(ValueError, match="num_heads"):
        MedusaConfig(hidden_size=8, vocab_size=10, feature_layer=2, num_heads=0)
    with pytest.raises(ValueError, match="shape"):
        MedusaHead(MedusaConfig(hidden_size=8, vocab_size=10, feature_layer=2), torch.zeros(10, 4))
    with pytest.raises(ValueError, match="shared_lm_head"):
        MedusaHead(MedusaConfig(hidden_size=8, vocab_size=10, feature_layer=2, shared_lm_head=True))
    with pytest.raises(ValueError, match="out of range"):
        head.head_logits(torch.randn(64), 2)


def test_target_dims_read_the_output_embedding(target):
    assert medusa_target_dims(target) == (64, 2, VOCAB)
