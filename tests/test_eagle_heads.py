"""EAGLE heads (specdec/heads/eagle.py): shapes, draft-vocabulary mapping, cached vs full forward."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.heads import Eagle1Head, Eagle3Head, EagleConfig, check_draft_vocab, default_feature_layers
from specdec.training import build_draft_vocab

torch.set_num_threads(1)  # the CI box is shared: one thread avoids OpenMP oversubscription stalls


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4)


def test_eagle1_head_shapes_and_saved_keys(target):
    head = Eagle1Head.from_target(target)
    H = target.config.hidden_size
    assert head.feature_layers == (4,)
    assert head.fc.weight.shape == (H, 2 * H) and head.fc.bias is not None
    B, T = 2, 5
    ids = torch.randint(0, VOCAB, (B, T))
    feats = (torch.randn(B, T, H),)
    out = head(ids, head.features_to_hidden(feats), torch.arange(T).expand(B, T))
    assert out.shape == (B, T, H)
    assert head.logits(out).shape == (B, T, VOCAB)
    keys = set(head.state_dict())
    assert "layers.0.input_layernorm.weight" not in keys  # EAGLE-1 layer 0 has no input norm
    assert not any("embed" in k or "lm_head" in k for k in keys)  # target's weights are shared, never saved
    assert head.embed_weight.data_ptr() == target.get_input_embeddings().weight.data_ptr()


def test_eagle1_head_without_fc_bias_and_two_layers(target):
    head = Eagle1Head.from_target(target, num_layers=2, fc_bias=False)
    keys = set(head.state_dict())
    assert "fc.bias" not in keys
    assert "layers.1.input_layernorm.weight" in keys and "layers.0.input_layernorm.weight" not in keys


def test_eagle3_head_shapes_with_reduced_vocab(target):
    counts = torch.arange(VOCAB).float()
    d2t, t2d = build_draft_vocab(counts, 40)
    head = Eagle3Head.from_target(target, draft_vocab=(d2t, t2d), feature_layers=(1, 2, 3))
    H = target.config.hidden_size
    assert head.fc.weight.shape == (H, 3 * H) and head.fc.bias is None
    assert head.layers[0].self_attn.q_proj.weight.shape[1] == 2 * H  # q/k/v read cat(embedding, hidden)
    assert head.lm_head.weight.shape == (40, H)
    B, T = 3, 4
    feats = tuple(torch.randn(B, T, H) for _ in range(3))
    hidden = head.features_to_hidden(feats)
    out = head(torch.randint(0, VOCAB, (B, T)), hidden, torch.arange(T).expand(B, T))
    assert out.shape == (B, T, H) and head.logits(out).shape == (B, T, 40)
    keys = set(head.state_dict())
    assert {"d2t", "t2d", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight"} <= keys


def test_eagle3_default_feature_layers_are_low_mid_high():
    assert default_feature_layers(32, "eagle3") == (2, 16, 29)
    assert default_feature_layers(12, "eagle1") == (12,)
    with pytest.raises(ValueError, match="feature_layers explicitly"):
        default_feature_layers(3, "eagle3")


def test_d2t_t2d_round_trip(target):
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (VOCAB,), generator=g).float()
    d2t, t2d = build_draft_vocab(counts, 30)
    head = Eagle3Head.from_target(target, draft_vocab=(d2t, t2d), feature_layers=(1, 2, 3))
    target_ids = head.draft_to_target(torch.arange(30))
    assert torch.equal(target_ids, t2d.nonzero()[:, 0])  # draft id i <-> i-th used target id, ascending
    assert t2d[target_ids].all() and int(t2d.sum()) == 30
    logits = torch.randn(2, VOCAB, generator=g)
    assert torch.equal(head.target_to_draft_logits(logits), logits[:, target_ids])
    check_draft_vocab(d2t, t2d, VOCAB)


def test_check_draft_vocab_rejects_inconsistent_maps():
    d2t, t2d = build_draft_vocab(torch.arange(10).float(), 4)
    bad = t2d.clone()
    bad[0] = True
    with pytest.raises(ValueError, match="t2d marks"):
        check_draft_vocab(d2t, bad)
    with pytest.raises(ValueError, match="another tokenizer"):
        check_draft_vocab(d2t, t2d, vocab_size=11)
    with pytest.raises(ValueError, match="increasing"):
        check_draft_vocab(torch.tensor([3, 1]), t2d)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_cached_forward_with_ragged_slots_matches_full_forward(target, kind):
    head = (Eagle1Head.from_target(target, num_layers=2) if kind == "eagle1"
            else Eagle3Head.from_target(target, feature_layers=(1, 2, 3), num_layers=2))
    H = target.config.hidden_size
    B, T = 2, 7
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    hidden = torch.randn(B, T, H, generator=g)
    pos = torch.arange(T).expand(B, T)
    full = head(ids, hidden, pos)
    # the same entries written in two chunks of different widths per row, via a cache (slot = position)
    cache = head.new_cache(B, 16)
    split = 4
    outs = []
    for lo, hi in [(0, split), (split, T)]:
        s = torch.arange(hi)
        mask = (s[None, None, :] <= pos[:, lo:hi, None])[:, None]
        outs.append(head(ids[:, lo:hi], hidden[:, lo:hi], pos[:, lo:hi], mask, cache, pos[:, lo:hi], hi))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_features_of_wrong_count_or_size_are_refused(target):
    head = Eagle3Head.from_target(target, feature_layers=(1, 2, 3))
    H = target.config.hidden_size
    with pytest.raises(ValueError, match="reads 3 target layers"):
        head.features_to_hidden((torch.randn(1, 2, H),))
    with pytest.raises(ValueError, match="hidden size of 64"):
        head.features_to_hidden(tuple(torch.randn(1, 2, H + 1) for _ in range(3)))


def test_config_validates_sizes():
    with pytest.raises(ValueError, match="multiple of"):
        EagleConfig(hidden_size=64, intermediate_size=8, num_attention_heads=4, num_key_value_heads=3,
                    vocab_size=10, feature_layers=(1,))


def test_building_and_loading_heads_leave_the_global_rng_alone(target, tmp_path):
    """The library never reads the global RNG: nn.Linear's default init used to draw from it before the seeded one."""
    from specdec.formats import load_eagle_head, save_eagle_head

    d2t, t2d = build_draft_vocab(torch.arange(VOCAB).float(), 40)
    builders = {
        "eagle1": lambda: Eagle1Head.from_target(target, num_layers=2),
        "eagle3": lambda: Eagle3Head.from_target(target, draft_vocab=(d2t, t2d), feature_layers=(1, 2, 3)),
    }
    for name, build in builders.items():
        torch.manual_seed(11)
        before = torch.random.get_rng_state()
        head = build()
        assert torch.equal(torch.random.get_rng_state(), before), f"building an {name} head moved the global RNG"
        torch.manual_seed(12)  # another global state: the head's own seeded init must not depend on it
        again = build()
        assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
        assert head.fc.weight.detach().any()  # initialised, not left at zero
        save_eagle_head(head, tmp_path / name)
        before = torch.random.get_rng_state()
        loaded = load_eagle_head(tmp_path / name, target)
        assert torch.equal(torch.random.get_rng_state(), before), f"loading an {name} head moved the global RNG"
        assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), loaded.state_dict().values()))
