"""DFlash and DSpark (specdec/heads/dflash.py, formats/dflash.py, training/dflash.py, recipes dflash / dspark):
one-forward block drafting against a dense per-row reference (ragged, left-padded, several updates, cache growth),
training blocks against inference blocks, the Markov transition and chain, float32 greedy identity with plain
decoding (batch 1 and a left-padded batch; chain and a level tree; gated DSpark), the sampling law at T > 0,
both checkpoint layouts with named errors, training, and the runner."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from test_generate_sampling import ALPHA, PARAMS, TARGET, TREE, _exact_law, _sampled_counts
from tiny_models import VOCAB, tiny_model

from specdec import recipes
from specdec.drafters.base import Feedback, ProposeRequest
from specdec.drafters.parallel import ParallelDrafter
from specdec.formats.dflash import (
    DFlashFormatError,
    export_dflash_zlab,
    load_dflash_head,
    mask_token_id_of,
    save_dflash_head,
)
from specdec.generate import generate
from specdec.heads.dflash import DFlashConfig, DFlashHead, DSparkHead, default_dflash_layers
from specdec.testing import chi_square_test
from specdec.training.dflash import block_accuracy, sample_anchors, train_dflash, train_dspark
from specdec.types import SamplingParams

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HEADS = {"dflash": (DFlashHead, {}), "dspark": (DSparkHead, {}),
         "dspark_gated": (DSparkHead, {"markov_head_type": "gated", "sample_from_anchor": False})}


def _gating():
    return pytest.importorskip("specdec.gating", reason="confidence gating (specdec.gating) is not merged yet")


def _feedback(model, ids, valid, layers, roots):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=valid.long(), output_hidden_states=True)
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    return Feedback(tokens=ids, next_tokens=ids, positions=positions, valid=valid,
                    features=tuple(out.hidden_states[i] for i in layers), roots=roots)


# --------------------------------------------------------------------------------------------------------
# Config and shapes
# --------------------------------------------------------------------------------------------------------


def test_default_layers_follow_zlab_plus_one_and_stay_in_range():
    assert default_dflash_layers(36, 5) == (2, 10, 18, 26, 34)  # z-lab Qwen3-4B-b16: [1, 9, 17, 25, 33] + 1
    for n in (1, 2, 3, 8):
        for k in (1, 2, 3):
            layers = default_dflash_layers(n, k)
            assert all(1 <= i <= n for i in layers) and list(layers) == sorted(set(layers))


@pytest.mark.parametrize("sample_from_anchor,levels,first", [(False, 3, 1), (True, 4, 0)])
def test_levels_and_slots_follow_sample_from_anchor(sample_from_anchor, levels, first):
    config = DFlashConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1,
                          vocab_size=10, feature_layers=(1,), mask_token_id=9, block_size=4,
                          sample_from_anchor=sample_from_anchor)
    assert config.num_levels == levels and config.first_slot == first


def test_config_errors_name_the_fix():
    base = dict(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_key_value_heads=1, vocab_size=10,
                feature_layers=(1,), mask_token_id=3)
    with pytest.raises(ValueError, match="mask_token_id 10 is outside"):
        DFlashConfig(**{**base, "mask_token_id": 10})
    with pytest.raises(ValueError, match="block_size >= 2"):
        DFlashConfig(**base, block_size=1)
    with pytest.raises(ValueError, match="markov_rank > 0"):
        DFlashConfig(**base, enable_confidence_head=True, confidence_head_with_markov=True)
    with pytest.raises(ValueError, match="not implemented"):
        DFlashConfig(**base, markov_rank=4, markov_head_type="rnn")
    with pytest.raises(ValueError, match="DSparkHead"):
        DFlashHead.from_target(tiny_model("llama"), markov_rank=4)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_protocol_shapes(name):
    cls, options = HEADS[name]
    model = tiny_model("qwen3", seed=1)
    head = cls.from_target(model, block_size=4, num_layers=2, **options)
    assert head.vocab_size == VOCAB and all(1 <= i <= 2 for i in head.feature_layers)
    ids = torch.randint(0, VOCAB, (3, 5), generator=torch.Generator().manual_seed(0))
    valid = torch.ones(3, 5, dtype=torch.bool)
    state = head.start(_feedback(model, ids, valid, head.feature_layers, ids[:, -1]))
    out = head.level_outputs(state)
    D = head.num_levels
    assert out.logits.shape == (3, D, VOCAB) and head.level_logits(state).shape == (3, D, VOCAB)
    drafter = ParallelDrafter(head)
    assert drafter.max_num_drafts == D and drafter.feature_layers == head.feature_layers
    if cls is DSparkHead:
        assert out.confidence.shape == (3, D) and bool(((out.confidence > 0) & (out.confidence < 1)).all())
        assert out.transition(ids[:, :2], 2).shape == (3, 2, VOCAB)
    else:
        assert out.confidence is None and out.transition is None


# --------------------------------------------------------------------------------------------------------
# One-forward drafting against the dense reference
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,name", [("qwen3", "dflash"), ("llama", "dspark"), ("qwen2", "dspark_gated")])
def test_block_draft_equals_dense_reference_over_ragged_updates(arch, name):
    cls, options = HEADS[name]
    model = tiny_model(arch, seed=2)
    head = cls.from_target(model, block_size=4, num_layers=2, qk_norm=arch == "qwen3", seed=4, **options)
    head.resync_every = 3
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 7), generator=g)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[1, :3] = False  # left padding
    valid[2, :6] = False
    fb = _feedback(model, ids, valid, head.feature_layers, torch.tensor([5, 6, 7]))
    state = head.start(fb)
    feats, positions, masks = list(fb.features), [fb.positions], [fb.valid]
    for step in range(14):  # ragged commits (rows accept different counts; row 0 finished after step 9)
        M = 3
        new_valid = torch.rand(3, M, generator=g) < 0.6
        new_valid[:, 0] = True
        new_valid = new_valid.long().cumprod(1).bool()
        if step > 9:
            new_valid[0] = False
        new_pos = state.lengths[:, None] + torch.arange(M)
        new_feats = tuple(torch.randn(3, M, f.shape[-1], generator=g) for f in feats)
        roots = torch.randint(0, VOCAB, (3,), generator=g)
        state = head.update(state, Feedback(tokens=ids[:, :M], next_tokens=ids[:, :M], positions=new_pos,
                                            valid=new_valid, features=new_feats, roots=roots))
        feats = [torch.cat([a, b], 1) for a, b in zip(feats, new_feats)]
        positions.append(new_pos)
        masks.append(new_valid)
        fast = head.draft_hidden(state)
        ref = head.draft_hidden_ref(feats, torch.cat(positions, 1), torch.cat(masks, 1), roots)
        torch.testing.assert_close(fast, ref, atol=2e-5, rtol=1e-4)
    assert state.cache.capacity > 32  # grew past the first allocation (16 + ...) while drafting stayed exact
    assert state.bound >= int(state.lengths.max())


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_training_blocks_equal_inference_blocks(name):
    cls, options = HEADS[name]
    model = tiny_model("qwen3", seed=3)
    head = cls.from_target(model, block_size=3, seed=5, **options)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
        feats = tuple(out.hidden_states[i] for i in head.feature_layers)
        anchors = torch.tensor([[1, 4, 8], [2, 3, 9]])
        blocks = head.blocks_hidden(feats, ids, anchors)                     # all six blocks in one forward
        for b in range(2):
            for j, a in enumerate(anchors[b].tolist()):
                ref = head.draft_hidden_ref(tuple(f[b:b + 1, :a] for f in feats), torch.arange(a)[None],
                                            torch.ones(1, a, dtype=torch.bool), ids[b:b + 1, a])
                torch.testing.assert_close(blocks[b, j], head.level_hidden(ref)[0], atol=2e-5, rtol=1e-4)


def test_markov_transition_and_greedy_chain():
    model = tiny_model("llama", seed=4)
    head = DSparkHead.from_target(model, block_size=4, markov_rank=8, seed=6)
    with torch.no_grad():
        head.markov_head.markov_w2.weight.mul_(200.0)  # a bias strong enough to change the argmax
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    state = head.start(_feedback(model, ids, torch.ones(2, 6, dtype=torch.bool), head.feature_layers, ids[:, -1]))
    out = head.level_outputs(state)
    prev = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    w1, w2 = head.markov_head.markov_w1.weight, head.markov_head.markov_w2.weight
    torch.testing.assert_close(out.transition(prev, 3), w1[prev] @ w2.T)
    chain, token = [], state.roots
    for d in range(1, head.num_levels + 1):  # sequential argmax under the parent's bias
        token = (out.logits[:, d - 1] + out.transition(token[:, None], d)[:, 0]).argmax(-1)
        chain.append(token)
    assert torch.equal(head.level_logits(state).argmax(-1), torch.stack(chain, 1))
    assert not torch.equal(out.logits.argmax(-1), torch.stack(chain, 1))  # the bias mattered
    prev_tokens = head.chain_prev_tokens(out.logits, state.roots, out.transition)
    assert torch.equal(prev_tokens[:, 0], state.roots)
    assert torch.equal(prev_tokens[:, 1:], torch.stack(chain, 1)[:, :-1])
    feats = torch.cat([head.level_hidden(head.draft_hidden(state)), w1[prev_tokens]], -1)
    expected = torch.sigmoid(head.confidence_head.proj(feats)[..., 0])
    torch.testing.assert_close(out.confidence, expected)


# --------------------------------------------------------------------------------------------------------
# Trained heads: greedy identity with plain decoding
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0, scale=4.0)


@pytest.fixture(scope="module")
def text(target):
    prompts = torch.randint(1, VOCAB, (32, 3), generator=torch.Generator().manual_seed(5))
    return generate(target, prompts, max_new_tokens=40, eos_token_id=[]).sequences  # the target's own text


@pytest.fixture(scope="module")
def trained(target, text):
    common = dict(steps=300, batch_size=8, seq_len=32, anchors_per_seq=16, block_size=4, lr=3e-3, progress=False)
    return {"dflash": train_dflash(target, text, **common).head, "dspark": train_dspark(target, text, **common).head}


def _prompts(batch):
    ids = torch.randint(1, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding, ragged rows
        mask[2, :4] = 0
    return ids, mask


@pytest.mark.parametrize("tree", [None, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_generate_greedy_is_token_identical_to_plain_greedy(target, trained, method, batch, tree):
    ids, mask = _prompts(batch)
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24)
    drafter = recipes.dflash(trained[method], tree) if method == "dflash" else \
        recipes.dspark(trained[method], tree, gate=None)
    spec = generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.stats.tau > 1.1 and spec.stats.num_target_forwards < plain.stats.num_target_forwards


@pytest.mark.parametrize("tree", [None, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]])
@pytest.mark.parametrize("batch", [1, 3])
def test_gated_dspark_greedy_is_token_identical_to_plain_greedy(target, trained, batch, tree):
    gating = _gating()
    ids, mask = _prompts(batch)
    plain = generate(target, ids, attention_mask=mask, max_new_tokens=24)
    for gate in ("confidence", gating.ConfidenceGate(threshold=0.3)):
        spec = generate(target, ids, attention_mask=mask, drafter=recipes.dspark(trained["dspark"], tree, gate=gate),
                        max_new_tokens=24)
        assert torch.equal(spec.sequences, plain.sequences)
        assert spec.stats.tau > 1.0


@pytest.mark.parametrize("arch", ["mistral", "qwen3", "gpt_neox", "phi3", "gemma"])
def test_any_architecture_greedy_identity_with_fresh_heads(arch):
    model = tiny_model(arch, seed=0)
    ids, mask = _prompts(3)
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=12)
    tree = [(0,), (1,), (0, 0)]
    for drafter in (recipes.dflash(DFlashHead.from_target(model, block_size=4), tree),
                    recipes.dspark(DSparkHead.from_target(model, block_size=4), tree)):
        spec = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=12)
        assert torch.equal(spec.sequences, plain.sequences), (arch, drafter)


def test_trained_dspark_confidence_is_calibrated_at_level_one(target, trained, text):
    head = trained["dspark"]
    windows = text[:8, :40]
    levels = block_accuracy(head, target, windows, num_anchors=16)
    assert levels.shape == (head.num_levels,) and float(levels[0]) > 0.3
    with torch.no_grad():
        out = target(input_ids=windows, output_hidden_states=True)
        feats = tuple(out.hidden_states[i] for i in head.feature_layers)
        anchors = sample_anchors(8, 40, head.num_levels, 16, generator=torch.Generator().manual_seed(0))
        hidden = head.blocks_hidden(feats, windows, anchors)
        prev = windows.gather(1, (anchors[:, :, None] + torch.arange(head.num_levels)).reshape(8, -1))
        confidence = torch.sigmoid(head.confidence_logits(hidden, prev.reshape(hidden.shape[:3])))
    assert abs(float(confidence[..., 0].mean()) - float(levels[0])) < 0.2  # the BCE made it track acceptance


def test_gate_cuts_each_rows_verified_depth_to_its_confidence(target, trained):
    gating = _gating()
    head = trained["dspark"]
    ids = torch.randint(1, VOCAB, (6, 8), generator=torch.Generator().manual_seed(11))
    fb = _feedback(target, ids, torch.ones_like(ids, dtype=torch.bool), head.feature_layers, ids[:, -1])
    out = head.level_outputs(head.start(fb))
    prefix = out.confidence.cumprod(1)                                         # P(levels 1..d all accepted)
    threshold = float(prefix[:, 1].median())                                   # rows fall on both sides
    drafter = recipes.dspark(head, gate=gating.ConfidenceGate(threshold=threshold))
    state = drafter.start(fb)
    request = ProposeRequest(roots=ids[:, -1], root_positions=torch.full((6,), 8), num_drafts=head.num_levels,
                             sampling=SamplingParams(), source=None, active=torch.ones(6, dtype=torch.bool))
    draft, _ = drafter.propose(state, request)
    depth = (draft.parents[:, 1:] >= 0).sum(1)                                 # a chain: present nodes = depth
    expected = ((prefix >= threshold).long().cumprod(1).sum(1)).clamp(min=1)
    assert torch.equal(depth, expected) and len(set(depth.tolist())) > 1
    ungated, _ = recipes.dspark(head, gate=None).propose(drafter.start(fb), request)
    kept = draft.parents[:, 1:] >= 0
    assert torch.equal(draft.tokens[kept], ungated.tokens[kept])               # cutting only removes drafts


# --------------------------------------------------------------------------------------------------------
# T > 0: the lossless verifier keeps the target's law (the harness of test_generate_sampling.py)
# --------------------------------------------------------------------------------------------------------


def _law_head(cls, **options):
    head = cls.from_target(TARGET, block_size=3, seed=21, **options)
    g = torch.Generator().manual_seed(22)
    with torch.no_grad():  # random weights, larger than the init: partial acceptance at both depths
        for p in head.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return head


def test_dflash_sampled_law_equals_enumerated_target_law():
    params = PARAMS["T1"]
    counts = _sampled_counts(recipes.dflash(_law_head(DFlashHead), TREE), params, seed=41)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"dflash tree at T1: {fit}"


def test_dspark_sampled_law_with_confidence_gate_equals_enumerated_target_law():
    gating = _gating()
    params = PARAMS["T0.7_top_p0.9"]
    head = _law_head(DSparkHead, markov_rank=4, sample_from_anchor=False)
    drafter = recipes.dspark(head, None, gate=gating.ConfidenceGate(threshold=0.4))
    counts = _sampled_counts(drafter, params, seed=42)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"gated dspark chain at T0.7_top_p0.9: {fit}"


def test_dspark_sampled_law_without_gate_equals_enumerated_target_law():
    params = PARAMS["T0.7_top_p0.9"]
    drafter = recipes.dspark(_law_head(DSparkHead, markov_rank=4), TREE, gate=None)
    counts = _sampled_counts(drafter, params, seed=43)
    fit = chi_square_test(counts, _exact_law(TARGET, params))
    assert fit.p_value > ALPHA, f"ungated dspark tree at T0.7_top_p0.9: {fit}"


# --------------------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------------------


def _same_head(a, b):
    assert type(a) is type(b) and a.config == b.config
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_speculators_round_trip_and_fields(tmp_path, name):
    cls, options = HEADS[name]
    model = tiny_model("qwen3", seed=6)
    head = cls.from_target(model, block_size=4, num_layers=2, seed=7, **options)
    folder = save_dflash_head(head, tmp_path / name, verifier_name_or_path="org/target")
    config = json.loads((folder / "config.json").read_text())
    kind = "dspark" if cls is DSparkHead else "dflash"
    assert config["speculators_model_type"] == kind
    assert config["architectures"] == ["DSparkSpeculator" if kind == "dspark" else "DFlashSpeculator"]
    assert config["aux_hidden_state_layer_ids"] == list(head.feature_layers)
    assert config["dflash_config"]["target_layer_ids"] == [i - 1 for i in head.feature_layers]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == head.num_levels
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    for alias in ("mask_token_id", "dspark_noise_token_id", "ptd_token_id"):
        assert config[alias] == head.config.mask_token_id
    assert mask_token_id_of(config) == head.config.mask_token_id
    if kind == "dspark":
        assert config["markov_rank"] == head.config.markov_rank and config["enable_confidence_head"] is True
    from safetensors.torch import load_file

    keys = set(load_file(str(folder / "model.safetensors")))
    assert "fc.weight" in keys and "hidden_norm.weight" in keys and "layers.1.self_attn.k_norm.weight" in keys
    assert not any(k.startswith(("embed", "lm_head")) for k in keys)
    _same_head(head, load_dflash_head(folder, model))


def _zlab_checkpoint(tmp_path, head, *, old: bool):
    """A checkpoint written by hand in z-lab's layout (config keys as z-lab/Qwen3-*-DFlash-b16)."""
    from safetensors.torch import save_file

    c = head.config
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden_size,
              "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
              "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
              "vocab_size": c.vocab_size, "num_target_layers": 2,
              "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
              "dflash_config": {"mask_token_id": c.mask_token_id,
                                "target_layer_ids": [i - 1 for i in c.feature_layers]}}
    if old:
        config["block_size"] = c.block_size
    else:
        config["dflash_config"]["block_size"] = c.block_size
    folder = tmp_path / ("old" if old else "new")
    folder.mkdir()
    state = {k: v.contiguous() for k, v in head.state_dict().items()}
    q, k, v = (state.pop(f"layers.0.self_attn.{n}_proj.weight") for n in "qkv")
    state["layers.0.self_attn.qkv_proj.weight"] = torch.cat([q, k, v])  # a fused export, split on load
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder, config


@pytest.mark.parametrize("old", [True, False])
def test_zlab_layout_loads_and_exports(tmp_path, old):
    model = tiny_model("qwen3", seed=8)
    head = DFlashHead.from_target(model, block_size=5, num_layers=1, seed=9)
    folder, _ = _zlab_checkpoint(tmp_path, head, old=old)
    _same_head(head, load_dflash_head(folder, model))
    out = export_dflash_zlab(head, tmp_path / "export", num_target_layers=2)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["num_target_layers"] == 2
    assert config["dflash_config"] == {"mask_token_id": head.config.mask_token_id, "block_size": 5,
                                       "target_layer_ids": [i - 1 for i in head.feature_layers]}
    _same_head(head, load_dflash_head(out, model))
    with pytest.raises(DFlashFormatError, match="save_dflash_head"):
        export_dflash_zlab(DSparkHead.from_target(model), tmp_path / "x")


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["dflash_config"].pop("target_layer_ids"), "dflash_config.target_layer_ids"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask token id"),
    (lambda c: c.pop("block_size"), "block_size"),
    (lambda c: c.update(layer_types=["sliding_attention"]), "sliding"),
    (lambda c: c.update(architectures=["Foo"], dflash_config=None), "neither"),
    (lambda c: c.update(ptd_token_id=0), "disagree"),
])
def test_zlab_missing_fields_give_named_errors(tmp_path, edit, match):
    model = tiny_model("qwen3", seed=8)
    folder, config = _zlab_checkpoint(tmp_path, DFlashHead.from_target(model, block_size=3), old=True)
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashFormatError, match=match):
        load_dflash_head(folder, model)


def test_hand_written_speculators_dspark_checkpoint_loads(tmp_path):
    """A config written as speculators' own tests write one (minimal fields, ``model.``-prefixed weights)."""
    from safetensors.torch import save_file

    model = tiny_model("qwen3", seed=12)
    head = DSparkHead.from_target(model, block_size=5, feature_layers=(1, 2), markov_rank=6, seed=13)
    config = {"speculators_model_type": "dspark", "speculators_config": None, "aux_hidden_state_layer_ids": [1, 2],
              "block_size": 5, "mask_token_id": head.config.mask_token_id, "markov_rank": 6,
              "markov_head_type": "vanilla", "enable_confidence_head": True, "confidence_head_with_markov": True,
              "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
                                           "num_hidden_layers": 1, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({f"model.{k}": v.contiguous() for k, v in head.state_dict().items()}, str(tmp_path / "model.safetensors"))
    loaded = load_dflash_head(tmp_path, model)
    _same_head(head, loaded)
    assert loaded.config.sample_from_anchor and loaded.num_levels == 5  # speculators' DSpark default


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.pop("aux_hidden_state_layer_ids") and c.pop("dflash_config"), "aux_hidden_state_layer_ids"),
    (lambda c: [c.pop(k) for k in ("mask_token_id", "dspark_noise_token_id", "ptd_token_id", "dflash_config")],
     "dflash_config.mask_token_id, mask_token_id"),
    (lambda c: c.pop("transformer_layer_config"), "transformer_layer_config"),
    (lambda c: c.update(speculators_model_type="peagle"), "not a DFlash"),
])
def test_speculators_missing_fields_give_named_errors(tmp_path, edit, match):
    model = tiny_model("qwen3", seed=8)
    folder = save_dflash_head(DSparkHead.from_target(model, block_size=3), tmp_path / "h")
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DFlashFormatError, match=match):
        load_dflash_head(folder, model)


def test_missing_weights_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save_dflash_head(DFlashHead.from_target(tiny_model("qwen3")), tmp_path / "h")
    state = load_file(str(folder / "model.safetensors"))
    state.pop("fc.weight")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(DFlashFormatError, match="fc.weight"):
        load_dflash_head(folder, tiny_model("qwen3"))


def test_loading_for_another_target_names_both_sizes(tmp_path):
    folder = save_dflash_head(DFlashHead.from_target(tiny_model("qwen3")), tmp_path / "h")
    with pytest.raises(ValueError, match="width 64 but the target's hidden size is 32"):
        load_dflash_head(folder, tiny_model("qwen3", hidden=32))


# --------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------


def test_anchors_are_distinct_in_range_and_seeded():
    a = sample_anchors(4, 20, 3, 10, generator=torch.Generator().manual_seed(0))
    b = sample_anchors(4, 20, 3, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (4, 10)
    assert int(a.min()) >= 1 and int(a.max()) <= 20 - 1 - 3
    assert all(len(set(row)) == 10 for row in a.tolist())
    with pytest.raises(ValueError, match="num_anchors must lie in"):
        sample_anchors(1, 20, 3, 17, generator=torch.Generator())


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_training_three_steps_is_finite_deterministic_and_saves_loadable_checkpoints(tmp_path, method):
    model = tiny_model("llama", seed=9)
    data = torch.randint(0, VOCAB, (4, 40), generator=torch.Generator().manual_seed(1))
    kwargs = dict(method=method, steps=3, batch_size=2, seq_len=16, anchors_per_seq=4, block_size=4, progress=False)
    first = train_dflash(model, data, out_dir=tmp_path / "run", save_every=2, **kwargs)
    second = train_dflash(model, data, **kwargs)
    assert len(first.history) == 3 and all(torch.isfinite(torch.tensor(r.loss)) for r in first.history)
    assert [r.loss for r in first.history] == [r.loss for r in second.history]
    if method == "dspark":
        assert all(r.confidence_loss > 0 for r in first.history)
    _same_head(first.head, load_dflash_head(tmp_path / "run" / "final", model))
    assert (tmp_path / "run" / "step-2" / "config.json").exists()
    assert len(json.loads((tmp_path / "run" / "final" / "history.json").read_text())) == 3


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_loss_falls_on_a_repeated_batch(method):
    batch = torch.randint(0, 6, (1, 16), generator=torch.Generator().manual_seed(2))
    # TARGET's laws are peaked (low entropy floor); one window (seq_len = its length) and every possible anchor:
    # the same batch at every step
    result = train_dflash(TARGET, batch, method=method, steps=60, batch_size=2, seq_len=16, anchors_per_seq=12,
                          block_size=4, lr=3e-3, warmup_steps=0, progress=False)
    losses = [r.loss for r in result.history]
    assert losses[-1] < 0.8 * losses[0], losses


# --------------------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_runner_smoke_on_the_demo_target(tmp_path, method):
    sys.path.insert(0, str(EXAMPLES))
    import train_dflash as runner

    data = tmp_path / "src"
    data.mkdir()
    for i in range(3):
        (data / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {i * j}\n" for j in range(40)))
    target = Path(runner.__file__).resolve().parents[1] / "specdec" / "demo" / "assets" / "target"
    out = tmp_path / "out"
    assert runner.main(["--method", method, "--target", str(target), "--data-dir", str(data), "--out-dir", str(out),
                        "--device", "cpu", "--steps", "2", "--batch-size", "1", "--seq-len", "24", "--anchors", "4",
                        "--block-size", "3", "--time-budget", "60"]) == 0
    summary = json.loads((out / method / "summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["validation_level_accuracy"]) == (3 if method == "dspark" else 2)
    import transformers

    load_dflash_head(out / method / "final", transformers.AutoModelForCausalLM.from_pretrained(target))
    if method == "dflash":
        assert (out / "dflash-zlab" / "config.json").exists()


# --------------------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_cuda_training_with_autocast_and_greedy_identity(method):
    model = tiny_model("llama", seed=0, scale=4.0).cuda()
    prompts = torch.randint(1, VOCAB, (32, 3), generator=torch.Generator().manual_seed(5)).cuda()
    text = generate(model, prompts, max_new_tokens=40, eos_token_id=[]).sequences
    head = train_dflash(model, text, method=method, steps=100, batch_size=8, seq_len=32, anchors_per_seq=16,
                        block_size=4, lr=3e-3, progress=False).head
    assert head.device.type == "cuda" and head.dtype == torch.float32
    ids, mask = _prompts(3)
    ids, mask = ids.cuda(), mask.cuda()
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=24)
    for tree in (None, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]):
        drafter = recipes.dflash(head, tree) if method == "dflash" else recipes.dspark(head, tree)
        spec = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24)
        assert torch.equal(spec.sequences, plain.sequences)
