"""Shared decoder blocks (specdec/nn): each against its HF Llama / Qwen2 counterpart in float32 on a tiny config,
plus the KV-cache attention against the uncached one and the backend restriction."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend
from transformers import LlamaConfig, Qwen2Config
from transformers.models.llama import modeling_llama as ml
from transformers.models.qwen2 import modeling_qwen2 as mq

from specdec.nn import (
    Attention,
    DecoderConfig,
    DecoderLayer,
    FusedInputDecoderLayer,
    KVCache,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    apply_rotary,
    cached_attention,
    masked_attention,
    masked_sdpa_backends,
    masked_sdpa_kernel,
    uncached_attention,
    zero_linear,
)

torch.set_num_threads(1)

H, HEADS, KV, INTER, EPS = 32, 4, 2, 48, 1e-5
D = H // HEADS
TOL = dict(rtol=1e-5, atol=1e-5)


def _llama(rope=None, kv=KV) -> LlamaConfig:
    return LlamaConfig(vocab_size=50, hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS,
                       num_key_value_heads=kv, rms_norm_eps=EPS, attn_implementation="eager",
                       rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})


def _decoder(qkv_bias=False) -> DecoderConfig:
    return DecoderConfig(hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV,
                         head_dim=D, rms_norm_eps=EPS, qkv_bias=qkv_bias)


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module


def _call(module, *args, **kwargs):
    out = module(*args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _inputs(B=2, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, generator=g)
    positions = torch.arange(T)[None].expand(B, T) + torch.tensor([[0], [7]])[:B]
    mask = torch.rand(B, 1, T, T, generator=g) < 0.5
    mask |= torch.eye(T, dtype=torch.bool)  # every row sees at least itself
    return x, positions, mask


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, 0.0, torch.finfo(torch.float32).min)


def test_rms_norm_matches_llama():
    ours = _randomize(RMSNorm(H, EPS), 0)
    ref = ml.LlamaRMSNorm(H, eps=EPS)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, H) * 4
    torch.testing.assert_close(ours(x), ref(x), **TOL)
    assert list(ours.state_dict()) == ["weight"]


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0},
                                  {"rope_type": "default", "rope_theta": 500000.0},
                                  {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}])
def test_rotary_embedding_and_rotation_match_llama(rope):
    config = _llama(rope)
    ours = RotaryEmbedding(D, rope["rope_theta"], rope.get("factor", 1.0))
    ref = ml.LlamaRotaryEmbedding(config)
    _, positions, _ = _inputs()
    positions = positions * 37  # far positions: rounding of the frequencies would show
    cos, sin = ours(positions, torch.float32)
    ref_cos, ref_sin = ref(torch.zeros(1, dtype=torch.float32), positions)
    assert cos.shape == (2, 1, 6, D)
    torch.testing.assert_close(cos[:, 0], ref_cos, **TOL)
    torch.testing.assert_close(sin[:, 0], ref_sin, **TOL)
    q, k = torch.randn(2, HEADS, 6, D), torch.randn(2, KV, 6, D)
    ref_q, ref_k = ml.apply_rotary_pos_emb(q, k, ref_cos, ref_sin, unsqueeze_dim=1)
    torch.testing.assert_close(apply_rotary(q, cos, sin), ref_q, **TOL)
    torch.testing.assert_close(apply_rotary(k, cos, sin), ref_k, **TOL)


def test_rotary_embedding_owns_a_float32_buffer_outside_the_state_dict():
    rope = RotaryEmbedding(D, 10000.0)
    fresh = rope.inv_freq.clone()
    assert "inv_freq" in dict(rope.named_buffers()) and not rope.state_dict()
    rope.to(torch.bfloat16)  # a head moved to bf16 must keep exact frequencies
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, fresh)
    cos, _ = rope(torch.arange(4)[None], torch.bfloat16)
    assert cos.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


def test_swiglu_matches_llama_mlp():
    ours = _randomize(SwiGLU(H, INTER), 1)
    ref = ml.LlamaMLP(_llama())
    ref.load_state_dict(ours.state_dict())  # same parameter names
    x = torch.randn(2, 5, H)
    torch.testing.assert_close(ours(x), ref(x), **TOL)


@pytest.mark.parametrize("kv", [HEADS, KV])
def test_attention_matches_llama_under_a_mask(kv):
    config = _llama(kv=kv)
    ours = _randomize(Attention(H, H, HEADS, kv, D), 2)
    ref = ml.LlamaAttention(config, 0)
    ref.load_state_dict(ours.state_dict())
    x, positions, mask = _inputs()
    cos, sin = RotaryEmbedding(D)(positions, torch.float32)
    out = ours(x, cos, sin, uncached_attention(mask)(0))
    ref_out = _call(ref, hidden_states=x, position_embeddings=(cos[:, 0], sin[:, 0]), attention_mask=_additive(mask))
    torch.testing.assert_close(out, ref_out, **TOL)


def test_attention_with_qkv_bias_matches_qwen2():
    config = Qwen2Config(vocab_size=50, hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS,
                         num_key_value_heads=KV, rms_norm_eps=EPS, use_sliding_window=False,
                         attn_implementation="eager")
    ours = _randomize(Attention(H, H, HEADS, KV, D, bias=True), 3)
    ref = mq.Qwen2Attention(config, 0)
    ref.load_state_dict(ours.state_dict())  # q/k/v biases, none on o_proj: the same keys
    x, positions, mask = _inputs(seed=1)
    cos, sin = RotaryEmbedding(D)(positions, torch.float32)
    out = ours(x, cos, sin, uncached_attention(mask)(0))
    ref_out = _call(ref, hidden_states=x, position_embeddings=(cos[:, 0], sin[:, 0]), attention_mask=_additive(mask))
    torch.testing.assert_close(out, ref_out, **TOL)


@pytest.mark.parametrize("input_norm", [True, False])
def test_decoder_layer_matches_llama_decoder_layer(input_norm):
    ours = _randomize(DecoderLayer(_decoder(), input_norm=input_norm), 4)
    ref = ml.LlamaDecoderLayer(_llama(), 0)
    if not input_norm:
        ref.input_layernorm = nn.Identity()  # EAGLE-1's layer 0
    assert set(ours.state_dict()) == set(ref.state_dict())  # checkpoint key names
    ref.load_state_dict(ours.state_dict())
    x, positions, mask = _inputs(seed=2)
    cos, sin = RotaryEmbedding(D)(positions, torch.float32)
    out = ours(x, cos, sin, uncached_attention(mask)(0))
    ref_out = _call(ref, x, attention_mask=_additive(mask), position_ids=positions,
                    position_embeddings=(cos[:, 0], sin[:, 0]))
    torch.testing.assert_close(out, ref_out, **TOL)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_fused_input_layer_reads_normed_embeddings_and_hidden(norm_before_residual):
    layer = _randomize(FusedInputDecoderLayer(_decoder(), norm_before_residual=norm_before_residual), 5)
    assert layer.self_attn.q_proj.in_features == 2 * H
    assert {"hidden_norm.weight", "input_layernorm.weight"} <= set(layer.state_dict())
    x, positions, mask = _inputs(seed=3)
    embeds = torch.randn_like(x)
    cos, sin = RotaryEmbedding(D)(positions, torch.float32)
    attend = uncached_attention(mask)(0)
    out = layer(x, cos, sin, attend, embeds=embeds)
    # the same layer written out: attention over [LN_e(e); LN_h(h)], residual h (or LN_h(h))
    normed = layer.hidden_norm(x)
    fused = torch.cat([layer.input_layernorm(embeds), normed], -1)
    h = (normed if norm_before_residual else x) + layer.self_attn(fused, cos, sin, attend)
    torch.testing.assert_close(out, h + layer.mlp(layer.post_attention_layernorm(h)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="embeds"):
        layer(x, cos, sin, attend)


def test_masked_attention_matches_an_explicit_softmax():
    g = torch.Generator().manual_seed(6)
    B, T, S = 2, 4, 7
    q, k, v = torch.randn(B, HEADS, T, D, generator=g), torch.randn(B, KV, S, D, generator=g), \
        torch.randn(B, KV, S, D, generator=g)
    mask = torch.rand(B, 1, T, S, generator=g) < 0.5
    mask[..., 0] = True
    kk, vv = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
    scores = (q @ kk.transpose(-1, -2)) / D ** 0.5
    ref = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vv
    torch.testing.assert_close(masked_attention(q, k, v, mask), ref, **TOL)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None].expand(B, 1, T, T)
    torch.testing.assert_close(masked_attention(q, k[:, :, :T], v[:, :, :T]),
                               masked_attention(q, k[:, :, :T], v[:, :, :T], causal), **TOL)


def test_cached_attention_in_chunks_equals_uncached_attention():
    layers = [_randomize(DecoderLayer(_decoder(), input_norm=i > 0), 7 + i) for i in range(2)]
    rope = RotaryEmbedding(D)
    B, T, C = 2, 7, 12
    x = torch.randn(B, T, H, generator=torch.Generator().manual_seed(8))
    positions = torch.arange(T)[None].expand(B, T)

    def run(hidden, pos, attend_for_layer):
        cos, sin = rope(pos, hidden.dtype)
        for i, layer in enumerate(layers):
            hidden = layer(hidden, cos, sin, attend_for_layer(i))
        return hidden

    full = run(x, positions, uncached_attention(None))
    cache = KVCache.zeros(2, B, KV, C, D)
    assert cache.capacity == C
    outs = []
    for lo, hi in [(0, 3), (3, T)]:  # slot = position; each chunk sees slots <= its own position
        pos = positions[:, lo:hi]
        mask = (torch.arange(hi)[None, None] <= pos[:, :, None])[:, None]
        outs.append(run(x[:, lo:hi], pos, cached_attention(cache, pos, mask, kv_length=hi)))
    torch.testing.assert_close(torch.cat(outs, 1), full, **TOL)
    assert cache.keys[:, :, :, T:].abs().sum() == 0  # nothing written past the entries


def test_masked_sdpa_backends_exclude_cudnn():
    backends = masked_sdpa_backends()
    assert SDPBackend.CUDNN_ATTENTION not in backends
    assert SDPBackend.EFFICIENT_ATTENTION in backends and SDPBackend.MATH in backends
    q = torch.randn(1, 2, 3, 4)
    with masked_sdpa_kernel():
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, masked_attention(q, q, q))


def test_blocks_are_built_at_zero_without_touching_the_global_rng():
    torch.manual_seed(5)
    before = torch.random.get_rng_state()
    layer = zero_linear(6, 4, bias=True, dtype=torch.float64)
    blocks = [DecoderLayer(_decoder(qkv_bias=True)), FusedInputDecoderLayer(_decoder()), SwiGLU(H, INTER),
              Attention(H, H, HEADS, KV, D)]
    assert torch.equal(torch.random.get_rng_state(), before)
    assert isinstance(layer, nn.Linear) and layer.weight.shape == (4, 6) and layer.weight.dtype == torch.float64
    assert layer.weight.device.type == "cpu" and layer.weight.requires_grad
    for module in [layer, *blocks]:
        linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        assert linears and all(not p.detach().any() for m in linears for p in m.parameters())
