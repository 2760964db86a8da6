"""Medusa checkpoint formats (specdec/formats/medusa.py): tiny checkpoints written by hand in exactly the Medusa
authors' layouts (``medusa_lm_head.pt`` / ``.safetensors``, keys ``{h}.{l}.linear.*`` and ``{h}.{L}.weight``; the
shared-``lm_head`` variant; a Medusa-2 full model) and vLLM's (``blocks.{h}.layers.{l}``, ``lm_heads.{h}``), load
and save, and the refusals."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tiny_models import VOCAB, tiny_model

from specdec.formats.medusa import (
    MedusaFormatError,
    MedusaMismatchError,
    load_medusa_head,
    read_medusa_state_dict,
    save_medusa_head,
)
from specdec.heads.medusa import MedusaHead

H = 64


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=1)


def _raw_heads(num_heads, num_layers, bias=True, vocab=VOCAB, hidden=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    def block():
        weight = torch.randn(hidden, hidden, generator=g) * 0.1
        return weight, torch.randn(hidden, generator=g) * 0.1 if bias else None

    blocks = [[block() for _ in range(num_layers)] for _ in range(num_heads)]
    projections = [torch.randn(vocab, hidden, generator=g) * 0.1 for _ in range(num_heads)]
    return blocks, projections


def _expected(blocks, projections, f, shared=None):
    out = []
    for k, layers in enumerate(blocks):
        x = f
        for w, b in layers:
            x = x + F.silu(F.linear(x, w, b))
        out.append(F.linear(x, shared if shared is not None else projections[k]))
    return torch.stack(out, -2)


def _authors_state(blocks, projections):
    state = {}
    for h, layers in enumerate(blocks):
        for layer, (w, b) in enumerate(layers):
            state[f"{h}.{layer}.linear.weight"] = w
            if b is not None:
                state[f"{h}.{layer}.linear.bias"] = b
        if projections is not None:
            state[f"{h}.{len(layers)}.weight"] = projections[h]
    return state


def _vllm_state(blocks, projections):
    state = {}
    for h, layers in enumerate(blocks):
        for layer, (w, b) in enumerate(layers):
            state[f"blocks.{h}.layers.{layer}.weight"] = w
            if b is not None:
                state[f"blocks.{h}.layers.{layer}.bias"] = b
        state[f"lm_heads.{h}.weight"] = projections[h]
    return state


def test_authors_pt_checkpoint_with_a_wrong_config_head_count(target, tmp_path):
    # as FasterDecoding/medusa-vicuna-7b-v1.3: the config says 2 heads, the weights hold 5
    blocks, projections = _raw_heads(5, 1)
    torch.save(_authors_state(blocks, projections), tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    with pytest.warns(UserWarning, match="says 2 heads but the weights hold 5"):
        head = load_medusa_head(tmp_path, target)
    assert head.config.num_heads == 5 and not head.config.shared_lm_head and head.config.bias
    f = torch.randn(3, H)
    assert torch.allclose(head(f), _expected(blocks, projections, f), atol=1e-5)


def test_authors_safetensors_with_two_blocks_per_head(target, tmp_path):
    blocks, projections = _raw_heads(3, 2, seed=1)
    save_file(_authors_state(blocks, projections), str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 2}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config agrees: no warning
        head = load_medusa_head(tmp_path, target)
    assert (head.config.num_heads, head.config.num_layers) == (3, 2)
    f = torch.randn(2, 4, H)
    assert torch.allclose(head(f), _expected(blocks, projections, f), atol=1e-5)


def test_authors_shared_lm_head_layout_uses_the_targets_lm_head(target, tmp_path):
    blocks, _ = _raw_heads(4, 1, seed=2)
    save_file(_authors_state(blocks, None), str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 4, "medusa_num_layers": 1, "version": "2"}))
    head = load_medusa_head(tmp_path, target)
    assert head.config.shared_lm_head
    f = torch.randn(2, H)
    lm_head = target.get_output_embeddings().weight
    assert torch.allclose(head(f), _expected(blocks, None, f, shared=lm_head), atol=1e-5)


def test_medusa2_full_model_checkpoint_reads_only_the_heads(target, tmp_path):
    blocks, projections = _raw_heads(2, 1, seed=3)
    state = {f"medusa_head.{k}": v for k, v in _authors_state(blocks, projections).items()}
    state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(H, H)  # base weights in the same file
    state["lm_head.weight"] = torch.zeros(VOCAB, H)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "medusa_num_heads": 2,
                                                      "medusa_num_layers": 1}))
    head = load_medusa_head(tmp_path, target)
    f = torch.randn(H)
    assert torch.allclose(head(f), _expected(blocks, projections, f), atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_vllm_layout_with_and_without_fc_bias(target, tmp_path, bias):
    blocks, projections = _raw_heads(3, 1, bias=bias, seed=4)
    save_file({f"medusa_heads.{k}": v for k, v in _vllm_state(blocks, projections).items()},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": VOCAB,
        "num_heads": 3, "num_hidden_layers": 1, "max_paths": 64, "topk": 10, "medusa_fc_bias": bias}))
    head = load_medusa_head(tmp_path, target)
    assert head.config.bias is bias and head.config.num_heads == 3
    f = torch.randn(2, H)
    assert torch.allclose(head(f), _expected(blocks, projections, f), atol=1e-5)


def test_vllm_original_lm_head_layout(target, tmp_path):
    blocks, _ = _raw_heads(2, 1, bias=False, seed=5)
    state = {k: v for k, v in _vllm_state(blocks, [torch.zeros(VOCAB, H)] * 2).items() if "lm_heads" not in k}
    state["lm_head.weight"] = target.get_output_embeddings().weight.detach().clone()
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "medusa", "hidden_size": H, "vocab_size": VOCAB,
                                                      "num_heads": 2, "num_hidden_layers": 1,
                                                      "original_lm_head": True}))
    head = load_medusa_head(tmp_path, target)
    assert head.config.shared_lm_head and not head.config.bias


@pytest.mark.parametrize("layout", ["medusa", "vllm"])
@pytest.mark.parametrize("shared", [False, True])
def test_save_then_load_round_trip(target, tmp_path, layout, shared):
    head = MedusaHead.from_target(target, num_heads=3, num_layers=2, shared_lm_head=shared)
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    folder = save_medusa_head(head, tmp_path / "out", layout=layout, base_model_name_or_path="tiny")
    config = json.loads((folder / "config.json").read_text())
    raw = read_medusa_state_dict(folder)
    if layout == "medusa":
        assert (folder / "medusa_lm_head.safetensors").exists()
        assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 2
        assert "2.1.linear.weight" in raw and ("2.2.weight" in raw) is (not shared)
    else:
        assert (folder / "model.safetensors").exists() and config["model_type"] == "medusa"
        assert config["original_lm_head"] is shared and config["medusa_fc_bias"] is True
        assert "blocks.2.layers.1.weight" in raw and ("lm_heads.2.weight" in raw) is (not shared)
    again = load_medusa_head(folder, target)
    f = torch.randn(4, H)
    assert torch.allclose(again(f), head(f), atol=1e-6)


def test_save_as_torch_pickle_like_the_authors(target, tmp_path):
    head = MedusaHead.from_target(target, num_heads=2)
    folder = save_medusa_head(head, tmp_path, weights_format="pt")
    assert (folder / "medusa_lm_head.pt").exists() and not (folder / "medusa_lm_head.safetensors").exists()
    assert torch.equal(load_medusa_head(folder, target).lm_head_weight, head.lm_head_weight)


def test_heads_for_another_hidden_size_are_refused_by_name(target, tmp_path):
    blocks, projections = _raw_heads(2, 1, hidden=32)
    torch.save(_authors_state(blocks, projections), tmp_path / "medusa_lm_head.pt")
    with pytest.raises(MedusaMismatchError, match="hidden size 32 but the target has hidden size 64"):
        load_medusa_head(tmp_path, target)


def test_heads_for_another_vocabulary_are_refused_by_name(target, tmp_path):
    blocks, projections = _raw_heads(2, 1, vocab=50)
    save_file(_vllm_state(blocks, projections), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "medusa", "num_heads": 2, "medusa_fc_bias": True}))
    with pytest.raises(MedusaMismatchError, match=f"vocabulary of 50 tokens but the target has {VOCAB}"):
        load_medusa_head(tmp_path, target)


def test_unsupported_or_broken_checkpoints_are_refused(target, tmp_path):
    blocks, projections = _raw_heads(2, 1)
    state = _vllm_state(blocks, projections)
    save_file({**state, "token_map": torch.arange(10)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaFormatError, match="token_map"):
        load_medusa_head(tmp_path, target)
    save_file({k: v for k, v in state.items() if k != "lm_heads.1.weight"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaFormatError, match="projections for heads"):
        load_medusa_head(tmp_path, target)
    save_file({"fc.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(MedusaFormatError, match="no Medusa residual blocks"):
        load_medusa_head(tmp_path, target)
    with pytest.raises(FileNotFoundError, match="medusa_lm_head"):
        load_medusa_head(tmp_path / "empty", target) if (tmp_path / "empty").mkdir() is None else None
