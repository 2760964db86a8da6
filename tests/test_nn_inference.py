"""The shared blocks' fused inference path (specdec/nn/inference.py): fused projections, rope_store into the cache,
one-launch norms. Run here through the Triton interpreter (kernel_mode "triton"), against the modules as written."""
from __future__ import annotations

import pytest
import torch
from test_nn import _randomize as _random  # the same random weights as the blocks' own tests
from torch import nn

from specdec.fused import decode_kernels
from specdec.kernels import interpreter_enabled, kernel_mode, triton_available
from specdec.nn import (
    DecoderConfig,
    DecoderLayer,
    FusedInputDecoderLayer,
    KVCache,
    RotaryEmbedding,
    cached_attention,
    uncached_attention,
)
from specdec.nn.inference import fused_inference, fused_linear, use_fused_layers

torch.set_num_threads(1)

# the kernels interpreted on CPU, and on the GPU as the drafters run them
DEVICES = (["cpu"] if triton_available() and interpreter_enabled() else []) + (
    ["cuda"] if torch.cuda.is_available() and triton_available() else [])
H, HEADS, KV, INTER, D = 32, 4, 2, 48, 8


def _config(qkv_bias: bool = False) -> DecoderConfig:
    return DecoderConfig(hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV,
                         head_dim=D, rms_norm_eps=1e-5, qkv_bias=qkv_bias)


def _stack(kind: str) -> list[nn.Module]:
    if kind == "eagle3":
        first = FusedInputDecoderLayer(_config(), norm_before_residual=True)
    else:
        first = DecoderLayer(_config(qkv_bias=kind == "bias"), input_norm=kind != "eagle1")
    return [_random(first, 1), _random(DecoderLayer(_config()), 2)]


def _run_chunks(layers, x, embeds, positions, fused: bool):
    """Two chunks over a cache (slot = position, one row's slots shifted: per-row slots), then an uncached pass."""
    B, T, _ = x.shape
    device = x.device
    cache = KVCache.zeros(len(layers), B, KV, T + 3, D, device=device)
    rope = RotaryEmbedding(D).to(device)
    outs = []
    mode = ("auto" if x.is_cuda else "triton") if fused else "torch"
    previous = use_fused_layers(fused)
    with torch.no_grad(), kernel_mode(mode):
        for lo, hi in [(0, 3), (3, T)]:
            pos = positions[:, lo:hi]
            slots = pos + torch.tensor([[0], [3]], device=device)  # row 1 three slots further
            s = torch.arange(T + 3, device=device)
            mask = ((s[None, None] <= slots[:, :, None]) & (s[None, None] >= slots[:, :1, None] - lo))[:, None]
            cos, sin = rope(pos, x.dtype)
            h = x[:, lo:hi]
            attend = cached_attention(cache, slots, mask)
            for i, layer in enumerate(layers):
                h = layer(h, cos, sin, attend(i), embeds=embeds[:, lo:hi])
            outs.append(h)
        cos, sin = rope(positions, x.dtype)
        h = x
        for layer in layers:
            h = layer(h, cos, sin, uncached_attention(None)(0), embeds=embeds)
    use_fused_layers(previous)
    return torch.cat(outs, 1), h, cache


@pytest.mark.skipif(not DEVICES, reason="needs triton on CUDA or interpreted")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "eagle1", "eagle3", "bias"])
def test_fused_path_equals_the_modules_over_a_cache_and_without(kind, device):
    layers = [layer.to(device) for layer in _stack(kind)]
    g = torch.Generator().manual_seed(3)
    x, embeds = torch.randn(2, 7, H, generator=g).to(device), torch.randn(2, 7, H, generator=g).to(device)
    positions = torch.arange(7, device=device)[None].expand(2, 7)
    cached, uncached, cache = _run_chunks(layers, x, embeds, positions, fused=True)
    cached_ref, uncached_ref, cache_ref = _run_chunks(layers, x, embeds, positions, fused=False)
    tol = dict(rtol=1e-4, atol=1e-4) if device == "cuda" else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached, cached_ref, **tol)
    torch.testing.assert_close(uncached, uncached_ref, **tol)
    torch.testing.assert_close(cache.keys, cache_ref.keys, **tol)
    torch.testing.assert_close(cache.values, cache_ref.values, **tol)
    torch.testing.assert_close(cached, uncached, **tol)  # the cache path is the uncached one, chunked
    assert "_fused_linears" in layers[0].self_attn.__dict__ and "_fused_linears" in layers[0].mlp.__dict__
    assert cache.keys[:, 0, :, 7:].abs().sum() == 0 and cache.keys[:, 1, :, :3].abs().sum() == 0


def test_fused_linear_follows_in_place_updates_and_replaced_weights():
    attn = _random(DecoderLayer(_config(qkv_bias=True)), 4).self_attn
    names = ("q_proj", "k_proj", "v_proj")
    with torch.no_grad():
        weight, bias = fused_linear(attn, names)
        torch.testing.assert_close(weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        assert fused_linear(attn, names)[0] is weight  # cached
        attn.k_proj.weight.mul_(2.0)  # in place: copied again into the same tensor
        again, bias_again = fused_linear(attn, names)
        assert again is weight and bias_again is bias
        torch.testing.assert_close(weight[HEADS * D:HEADS * D + KV * D], attn.k_proj.weight, rtol=0, atol=0)
        attn.v_proj.weight = nn.Parameter(torch.zeros_like(attn.v_proj.weight))  # replaced: a new copy
        fresh, _ = fused_linear(attn, names)
        assert fresh is not weight and fresh[-KV * D:].abs().sum() == 0
    mlp = _random(DecoderLayer(_config()), 5).mlp
    with torch.no_grad():
        w, b = fused_linear(mlp, ("gate_proj", "up_proj"))
    assert b is None and w.shape == (2 * INTER, H)
    assert "_fused_linears" not in mlp.state_dict() and len(mlp.state_dict()) == 3


def test_when_the_fused_path_runs():
    x = torch.randn(2, H)
    with kernel_mode("triton"):
        assert torch.is_grad_enabled() and not fused_inference(x)  # training: the modules as written
        with torch.no_grad():
            assert fused_inference(x)
            with decode_kernels(fused_ops=False):
                assert not fused_inference(x)
            assert fused_inference(x)
            previous = use_fused_layers(False)
            try:
                assert previous and not fused_inference(x)
            finally:
                use_fused_layers(previous)
    with torch.no_grad():
        assert fused_inference(x) == (x.is_cuda and triton_available())  # auto: CUDA only
    with pytest.raises(ValueError, match="True or False"):
        use_fused_layers(1)
