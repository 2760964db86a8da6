"""Checkpoint loading / saving (specdec/formats/eagle.py).

Each test builds a small *source module* the way the public code lays it out (HF Llama pieces: ``fc``, a
``LlamaDecoderLayer`` without ``input_layernorm`` for EAGLE-1; a 2H-input ``midlayer`` with ``hidden_norm`` for
EAGLE-3), saves its state dict under the public key names (the EAGLE authors' checkpoints, e.g.
``yuhuili/EAGLE-LLaMA3-Instruct-8B`` and ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``, and vLLM's ``speculators``),
loads it with ``load_eagle_head`` and checks that the head computes what the source module computes.
"""
from __future__ import annotations

import json

import pytest
import torch
from tiny_models import VOCAB, tiny_model
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as ml

from specdec.formats import export_speculators, load_eagle_head, save_eagle_head
from specdec.heads import Eagle1Head, Eagle3Head
from specdec.training import build_draft_vocab

torch.set_num_threads(1)

H, HEADS = 64, 4


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4)


def _llama_config(kv_heads=HEADS, theta=10000.0, eps=1e-6, qkv_bias=False) -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=96, num_attention_heads=HEADS,
                       num_key_value_heads=kv_heads, rms_norm_eps=eps, attention_bias=qkv_bias,
                       rope_parameters={"rope_type": "default", "rope_theta": theta}, attn_implementation="eager")


def _additive_causal(B, T):
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    return mask[None, None].expand(B, 1, T, T)


def _call(module, *args, **kwargs):
    out = module(*args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


class SourceEagle1(nn.Module):
    """The authors' EAGLE-1 draft (``cnets1.Model`` / v1 ``cnets.Model``) from HF Llama pieces."""

    def __init__(self, cfg: LlamaConfig, fc_bias: bool, embed: torch.Tensor):
        super().__init__()
        self.embed_tokens = nn.Embedding.from_pretrained(embed.clone(), freeze=True)
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=fc_bias)
        layer = ml.LlamaDecoderLayer(cfg, 0)
        layer.input_layernorm = nn.Identity()  # layer 0 has no input norm
        self.layers = nn.ModuleList([layer])
        self.rotary = ml.LlamaRotaryEmbedding(cfg)

    def forward(self, ids, feature, positions):
        x = self.fc(torch.cat([self.embed_tokens(ids), feature], -1))
        pe = self.rotary(x, positions)
        return _call(self.layers[0], x, attention_mask=_additive_causal(*ids.shape), position_ids=positions,
                     position_embeddings=pe)


class SourceMidlayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, norm_before_residual: bool):
        super().__init__()
        self.self_attn = ml.LlamaAttention(cfg, 0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * cfg.hidden_size, old.out_features, bias=False))
        self.mlp = ml.LlamaMLP(cfg)
        self.hidden_norm = ml.LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = ml.LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ml.LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, emb, hidden, mask, pe):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(emb), normed], -1)
        attn, _ = self.self_attn(hidden_states=x, position_embeddings=pe, attention_mask=mask)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h))


class SourceEagle3(nn.Module):
    """The authors' EAGLE-3 draft (``cnets.Model``) from HF Llama pieces."""

    def __init__(self, cfg: LlamaConfig, d2t, t2d, embed, norm_before_residual=False):
        super().__init__()
        self.embed_tokens = nn.Embedding.from_pretrained(embed.clone(), freeze=True)
        self.fc = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = SourceMidlayer(cfg, norm_before_residual)
        self.norm = ml.LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, d2t.shape[0], bias=False)
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)
        self.rotary = ml.LlamaRotaryEmbedding(cfg)

    def forward(self, ids, features, positions):
        h = self.fc(features)
        pe = self.rotary(h, positions)
        out = self.midlayer(self.embed_tokens(ids), h, _additive_causal(*ids.shape), pe)
        return out, self.lm_head(self.norm(out))


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.1) + (1.0 if p.dim() == 1
                                                                                               and "norm" in name
                                                                                               else 0.0))
    return module.eval()


def _inputs(B=2, T=6, width=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    return ids, torch.randn(B, T, width, generator=g), torch.arange(T).expand(B, T)


def _save(folder, state, config, fmt="safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    elif fmt == "sharded":
        from safetensors.torch import save_file

        keys = sorted(state)
        shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
                  "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
        for name, ks in shards.items():
            save_file({k: state[k] for k in ks}, str(folder / name))
        index = {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _eagle_config(cfg: LlamaConfig, **extra):
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
           "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps, "vocab_size": VOCAB,
           "max_position_embeddings": 2048, "pad_token_id": 0, "tie_word_embeddings": False,
           "torch_dtype": "float16"}
    out.update(extra)
    return out


def _source_eagle1(target, fc_bias, kv_heads=HEADS, theta=10000.0, seed=0):
    cfg = _llama_config(kv_heads=kv_heads, theta=theta)
    return cfg, _randomize(SourceEagle1(cfg, fc_bias, target.get_input_embeddings().weight), seed)


def _check_eagle1(head, source):
    ids, feature, pos = _inputs()
    assert isinstance(head, Eagle1Head)
    with torch.no_grad():
        torch.testing.assert_close(head(ids, head.features_to_hidden((feature,)), pos), source(ids, feature, pos),
                                   rtol=1e-5, atol=1e-5)


def test_load_eagle1_vicuna_style_bin_with_fc_bias_and_embeddings(target, tmp_path):
    cfg, source = _source_eagle1(target, fc_bias=True)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith("rotary")}
    assert "embed_tokens.weight" in state and "fc.bias" in state  # v1-era checkpoints carry both
    folder = _save(tmp_path / "e1", state, _eagle_config(cfg), fmt="bin")  # no "bias" key: default True
    head = load_eagle_head(folder, target)
    assert head.config.fc_bias and head.config.num_key_value_heads == HEADS
    _check_eagle1(head, source)


def test_load_eagle1_llama3_style_safetensors_without_bias(target, tmp_path):
    cfg, source = _source_eagle1(target, fc_bias=False, kv_heads=2, theta=500000.0, seed=1)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("rotary", "embed"))}
    config = _eagle_config(cfg, num_key_value_heads=2, rope_theta=500000.0, bias=False)
    head = load_eagle_head(_save(tmp_path / "e1", state, config), target)
    assert not head.config.fc_bias and head.config.num_key_value_heads == 2 and head.config.rope_theta == 500000.0
    _check_eagle1(head, source)


def test_load_from_a_hub_id_downloads_the_weights_and_config(target, tmp_path, monkeypatch):
    import huggingface_hub

    cfg, source = _source_eagle1(target, fc_bias=False, seed=2)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("rotary", "embed"))}
    folder = _save(tmp_path / "snapshot", state, _eagle_config(cfg, bias=False))
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    head = load_eagle_head("yuhuili/EAGLE-LLaMA3-Instruct-8B", target)
    assert [c[0] for c in calls] == ["yuhuili/EAGLE-LLaMA3-Instruct-8B"]
    assert set(calls[0][1]["allow_patterns"]) >= {"*.json", "*.safetensors", "*.bin"}
    _check_eagle1(head, source)
    with pytest.raises(ValueError, match="is a file"):
        load_eagle_head(folder / "config.json", target)


@pytest.mark.parametrize("loader", ["load_eagle_head", "load_peagle_head", "load_dflash_head", "load_medusa_head"])
def test_a_missing_local_folder_is_named_not_sent_to_the_hub(target, tmp_path, monkeypatch, loader):
    import huggingface_hub

    import specdec.formats

    def no_hub(repo_id, **kwargs):
        raise AssertionError(f"a local path went to the hub: {repo_id}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_hub)
    load = getattr(specdec.formats, loader)
    for missing in (tmp_path / "runs" / "final", "./heads/final", "runs/peagle/final"):
        with pytest.raises(FileNotFoundError, match="no folder at .*config.json"):
            load(str(missing), target)


def _source_eagle3(target, draft_vocab=40, seed=0, norm_before_residual=False, kv_heads=2):
    cfg = _llama_config(kv_heads=kv_heads, eps=1e-5)
    counts = torch.randint(0, 100, (VOCAB,), generator=torch.Generator().manual_seed(seed)).float()
    d2t, t2d = build_draft_vocab(counts, draft_vocab)
    source = SourceEagle3(cfg, d2t, t2d, target.get_input_embeddings().weight, norm_before_residual)
    return cfg, _randomize(source, seed)


def _check_eagle3(head, source, layers=(2, 2, 1)):
    assert isinstance(head, Eagle3Head)
    assert head.feature_layers == tuple(layers)
    ids, _, pos = _inputs()
    feats = tuple(torch.randn(2, 6, H, generator=torch.Generator().manual_seed(i)) for i in range(3))
    with torch.no_grad():
        out = head(ids, head.features_to_hidden(feats), pos)
        ref_out, ref_logits = source(ids, torch.cat(feats, -1), pos)
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head.logits(out), ref_logits, rtol=1e-5, atol=1e-5)
    draft_ids = torch.arange(source.d2t.shape[0])
    assert torch.equal(head.draft_to_target(draft_ids), draft_ids + source.d2t)


def test_load_eagle3_authors_format(target, tmp_path):
    cfg, source = _source_eagle3(target)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("rotary", "embed"))}
    assert any(k.startswith("midlayer.") for k in state) and state["t2d"].dtype == torch.bool
    config = _eagle_config(cfg, num_key_value_heads=2, draft_vocab_size=40, num_hidden_layers=40)  # misstated
    head = load_eagle_head(_save(tmp_path / "e3", state, config, fmt="bin"), target)
    assert head.config.num_layers == 1 and head.config.draft_vocab == 40
    _check_eagle3(head, source)


def _speculators_config(cfg, layers, norm_before_residual=False):
    layer_config = {k: v for k, v in _eagle_config(cfg, num_key_value_heads=2).items() if k != "torch_dtype"}
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                     "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                               "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
        "transformer_layer_config": layer_config, "draft_vocab_size": 40, "target_hidden_size": None,
        "norm_before_residual": norm_before_residual, "eagle_aux_hidden_state_layer_ids": list(layers),
    }


@pytest.mark.parametrize("prefix,with_embed,norm_before_residual", [("", True, False), ("model.", False, False),
                                                                    ("", False, True)])
def test_load_speculators_format(target, tmp_path, prefix, with_embed, norm_before_residual):
    cfg, source = _source_eagle3(target, seed=3, norm_before_residual=norm_before_residual)
    state = {}
    for k, v in source.state_dict().items():
        if k.startswith("rotary") or (k.startswith("embed") and not with_embed):
            continue
        k = k.replace("midlayer.", "layers.0.")
        state[k if k in ("d2t", "t2d") or k.startswith("lm_head") else prefix + k] = v
    state["verifier_lm_head.weight"] = torch.zeros(VOCAB, H)  # present in some exports, never used
    folder = _save(tmp_path / "spec", state, _speculators_config(cfg, (1, 2, 3), norm_before_residual))
    head = load_eagle_head(folder, target)
    assert head.config.norm_before_residual == norm_before_residual
    _check_eagle3(head, source, layers=(1, 2, 3))


def test_load_specforge_model_prefixed_sharded(target, tmp_path):
    cfg, source = _source_eagle3(target, seed=4)
    state = {}
    for k, v in source.state_dict().items():
        if k.startswith("rotary"):
            continue
        k = k.replace("midlayer.", "layers.0.")
        state[k if k in ("d2t", "t2d") or k.startswith("lm_head") else "model." + k] = v
    assert "model.embed_tokens.weight" in state and "model.fc.weight" in state and "lm_head.weight" in state
    config = _eagle_config(cfg, num_key_value_heads=2, draft_vocab_size=40,
                           architectures=["LlamaForCausalLMEagle3"])
    head = load_eagle_head(_save(tmp_path / "sf", state, config, fmt="sharded"), target)
    _check_eagle3(head, source)


def test_head_for_another_hidden_size_is_refused(target, tmp_path):
    small = tiny_model("llama", layers=4, hidden=32)
    cfg, source = _source_eagle1(target, fc_bias=True)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("rotary", "embed"))}
    folder = _save(tmp_path / "e1", state, _eagle_config(cfg))
    with pytest.raises(ValueError, match=r"hidden size 64 but the target has hidden size 32"):
        load_eagle_head(folder, small)
    cfg3, source3 = _source_eagle3(target)
    state3 = {k: v for k, v in source3.state_dict().items() if not k.startswith(("rotary", "embed"))}
    folder3 = _save(tmp_path / "e3", state3, _eagle_config(cfg3, num_key_value_heads=2, draft_vocab_size=40))
    with pytest.raises(ValueError, match=r"hidden size 64 but the target has hidden size 32"):
        load_eagle_head(folder3, small)


def test_head_for_another_vocabulary_is_refused(target, tmp_path):
    cfg, source = _source_eagle1(target, fc_bias=True)
    state = {k: v for k, v in source.state_dict().items() if not k.startswith(("rotary", "embed"))}
    folder = _save(tmp_path / "e1", state, _eagle_config(cfg, vocab_size=VOCAB + 3))
    with pytest.raises(ValueError, match=rf"vocabulary of {VOCAB + 3} tokens but the target has {VOCAB}"):
        load_eagle_head(folder, target)
    cfg3, source3 = _source_eagle3(target)
    state3 = {k: v for k, v in source3.state_dict().items() if not k.startswith(("rotary", "embed"))}
    state3["t2d"] = torch.cat([state3["t2d"], torch.zeros(5, dtype=torch.bool)])
    config3 = _eagle_config(cfg3, num_key_value_heads=2, draft_vocab_size=40)
    config3.pop("vocab_size")
    with pytest.raises(ValueError, match=rf"{VOCAB + 5} tokens but the target has {VOCAB}"):
        load_eagle_head(_save(tmp_path / "e3", state3, config3), target)


def test_unsupported_eagle3_variant_is_refused(target, tmp_path):
    cfg, source = _source_eagle3(target)
    state = {k.replace("midlayer.", "layers.0."): v for k, v in source.state_dict().items()
             if not k.startswith(("rotary", "embed"))}
    config = _speculators_config(cfg, (2, 2, 1))
    config["norm_before_fc"] = True
    with pytest.raises(ValueError, match="norm_before_fc"):
        load_eagle_head(_save(tmp_path / "x", state, config), target)


def test_save_eagle_head_round_trip(target, tmp_path):
    head = _randomize(Eagle1Head.from_target(target, fc_bias=False), 7)
    loaded = load_eagle_head(save_eagle_head(head, tmp_path / "e1"), target)
    ids, feature, pos = _inputs()
    torch.testing.assert_close(loaded(ids, feature, pos), head(ids, feature, pos))
    d2t, t2d = build_draft_vocab(torch.arange(VOCAB).float(), 50)
    head3 = _randomize(Eagle3Head.from_target(target, draft_vocab=(d2t, t2d), num_layers=2), 8)
    folder = save_eagle_head(head3, tmp_path / "e3")
    keys = set(json.loads((folder / "config.json").read_text()))
    assert {"draft_vocab_size", "eagle_aux_hidden_state_layer_ids"} <= keys
    loaded3 = load_eagle_head(folder, target)
    feats = tuple(torch.randn(2, 6, H) for _ in range(3))
    torch.testing.assert_close(loaded3(ids, loaded3.features_to_hidden(feats), pos),
                               head3(ids, head3.features_to_hidden(feats), pos))


def test_export_speculators_round_trip_and_vllm_fields(target, tmp_path):
    d2t, t2d = build_draft_vocab(torch.arange(VOCAB).flip(0).float(), 60)
    head = _randomize(Eagle3Head.from_target(target, draft_vocab=(d2t, t2d), feature_layers=(1, 2, 3)), 9)
    folder = export_speculators(head, tmp_path / "spec", "org/tiny-llama", num_speculative_tokens=5)
    config = json.loads((folder / "config.json").read_text())
    # the fields vLLM's SpeculatorsConfig validates and reads
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    assert isinstance(config["transformer_layer_config"], dict)
    assert config["transformer_layer_config"]["vocab_size"] == VOCAB and config["draft_vocab_size"] == 60
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    loaded = load_eagle_head(folder, target)
    ids, _, pos = _inputs()
    feats = tuple(torch.randn(2, 6, H) for _ in range(3))
    torch.testing.assert_close(loaded.logits(loaded(ids, loaded.features_to_hidden(feats), pos)),
                               head.logits(head(ids, head.features_to_hidden(feats), pos)))


def test_export_speculators_refuses_eagle1(target, tmp_path):
    with pytest.raises(ValueError, match="save_eagle_head"):
        export_speculators(Eagle1Head.from_target(target), tmp_path / "x", "tiny")
