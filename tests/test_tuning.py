"""specdec.kernels.tuning: a verify forward's linears pick F.linear or the skinny kernel by timing both once."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.fused import FusedDecoder, decode_kernels, decode_settings
from specdec.kernels import tuning
from specdec.kernels.skinny import SkinnyConfig, skinny_config
from specdec.kernels.tuning import (
    SKINNY_TUNE_CONFIGS,
    clear_linear_picks,
    linear_picks,
    pick_fastest,
    tuned_linear_config,
)


@pytest.fixture(autouse=True)
def _no_picks():
    clear_linear_picks()
    yield
    clear_linear_picks()


def test_pick_fastest_keeps_the_default_unless_another_is_clearly_faster():
    assert pick_fastest({None: 10.0, "a": 9.9}, None) is None  # 1% faster: within the margin
    assert pick_fastest({None: 10.0, "a": 9.9, "b": 9.5}, None) == "b"
    assert pick_fastest({None: 10.0, "a": 12.0}, None) is None
    assert pick_fastest({None: 10.0, "a": 9.9}, None, margin=0.0) == "a"
    with pytest.raises(ValueError, match="default"):
        pick_fastest({"a": 1.0}, None)
    with pytest.raises(ValueError, match="margin"):
        pick_fastest({None: 1.0}, None, margin=-0.1)


class _Clock:
    """A timer for tests: runs each candidate once (its results are real) and hands out preset times in the order
    the candidates are timed (F.linear first, then the skinny launches)."""

    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def __call__(self, fn, reps):
        out = fn()
        assert isinstance(out, list) and all(isinstance(t, torch.Tensor) for t in out)
        self.calls += 1
        return self.times.pop(0)


def _weights(n=48, k=32, layers=3, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, k, generator=g).to(dtype) for _ in range(layers)], [None] * layers


def test_the_fastest_skinny_launch_is_kept_per_shape_and_rows_and_timed_once():
    weights, biases = _weights()
    candidates = list(dict.fromkeys((skinny_config(40, 48, 32), *SKINNY_TUNE_CONFIGS)))
    clock = _Clock([10.0] + [9.0, 8.0, 11.0, 12.0][:len(candidates)])
    pick = tuned_linear_config(weights, biases, 40, timer=clock)
    assert pick == candidates[1] and isinstance(pick, SkinnyConfig)
    assert clock.calls == 1 + len(candidates)
    again = _Clock([])
    assert tuned_linear_config(weights, biases, 40, timer=again) == pick and again.calls == 0  # kept
    assert list(linear_picks().values()) == [pick]
    (key,) = linear_picks()
    assert key[1:5] == (torch.bfloat16, 40, 48, 32)
    other = _Clock([5.0] + [9.0] * len(candidates))  # another row count is timed apart; F.linear wins there
    assert tuned_linear_config(weights, biases, 33, timer=other) is None and other.calls == 1 + len(candidates)
    clear_linear_picks()
    assert linear_picks() == {}


def test_every_candidate_is_timed_after_a_fused_norm_launch_as_a_forward_runs_it(monkeypatch):
    """Session 42: a BLAS product ends the chain of PDL launches, which a chain of products alone does not show; so
    each candidate's products are timed each after the fused norm (one per layer), and still give F.linear's result."""
    from specdec.kernels import tuning

    weights, biases = _weights()
    norms, tuning_norm = [], tuning.add_rms_norm

    def counted(x, residual, weight, eps, **kw):
        norms.append(x.shape)
        return tuning_norm(x, residual, weight, eps, **kw)
    monkeypatch.setattr(tuning, "add_rms_norm", counted)
    results = []

    def clock(fn, reps):
        results.append(fn())
        return 10.0 - len(results)
    clear_linear_picks()
    tuned_linear_config(weights, biases, 40, timer=clock)
    assert len(norms) == len(results) * len(weights) and set(norms) == {(40, 32)}
    for out in results:  # every candidate multiplies the same normed rows by every layer's matrix
        assert len(out) == len(weights) and all(o.shape == (40, 48) for o in out)
        for got, want in zip(out, results[0]):
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    clear_linear_picks()


def test_nothing_is_timed_where_the_skinny_kernel_cannot_run():
    clock = _Clock([])
    w32, b32 = _weights(dtype=torch.float32)
    assert tuned_linear_config(w32, b32, 40, timer=clock) is None  # float32: F.linear (no tensor-core rounding)
    weights, biases = _weights()
    assert tuned_linear_config(weights, biases, 65, timer=clock) is None  # past SKINNY_MAX_ROWS
    assert tuned_linear_config(weights, biases, 1, timer=clock) is None
    assert tuned_linear_config(weights, biases, 40) is None  # on CPU without a timer: never timed
    assert clock.calls == 0 and linear_picks() == {}


def test_bad_weight_lists_are_named():
    weights, biases = _weights()
    with pytest.raises(ValueError, match="no weights"):
        tuned_linear_config([], [], 40)
    with pytest.raises(ValueError, match="biases"):
        tuned_linear_config(weights, biases[:1], 40)
    with pytest.raises(ValueError, match="differ"):
        tuned_linear_config([weights[0], weights[1][:, :16]], [None, None], 40)


def test_tune_linears_is_a_decode_setting_fused_decoders_take():
    assert decode_settings()["tune_linears"] is True
    model = tiny_model("llama")
    with decode_kernels(tune_linears=False):
        assert decode_settings()["tune_linears"] is False
        assert FusedDecoder(model, max_positions=16).settings["tune_linears"] is False
    assert FusedDecoder(model, max_positions=16).settings["tune_linears"] is True
    with pytest.raises(ValueError, match="tune_linears"):
        with decode_kernels(tune_linears="yes"):
            pass


def test_each_projection_is_timed_over_every_layer_of_it():
    model = tiny_model("llama")
    dec = FusedDecoder(model, max_positions=16)
    for kind, name in (("qkv", "wqkv"), ("o", "wo"), ("gate_up", "wgu"), ("down", "wd")):
        weights, biases = dec._projection(kind)
        assert len(weights) == len(biases) == len(dec.layers) == model.config.num_hidden_layers
        assert all(w is getattr(lay, name) for w, lay in zip(weights, dec.layers))
    assert dec._projection("head") == ([dec.head_w], [dec.head_b])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_verify_sized_bf16_forward_times_its_projections_once_and_keeps_the_logits():
    from specdec.static import slot_cache

    model = tiny_model("llama").to("cuda", torch.bfloat16)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    B, T, S = 1, 40, 64
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0)).cuda()
    positions = torch.arange(T).cuda()[None]
    mask = torch.where(torch.ones(T, S, dtype=torch.bool).tril(), 0.0, torch.finfo(torch.bfloat16).min)
    mask = mask.to("cuda", torch.bfloat16)[None, None]
    outs = {}
    for tune in (False, True):
        with decode_kernels(tune_linears=tune):
            dec = FusedDecoder(model, max_positions=S)
        cache = slot_cache([((B, config.num_key_value_heads, S, head_dim), torch.bfloat16)] * 2, torch.device("cuda"))
        outs[tune] = dec(tokens, positions, mask, torch.arange(T).cuda(), cache.layers, ())[0].float()
        assert bool(linear_picks()) == tune
    picks = linear_picks()
    assert len(picks) == 5 and {key[2] for key in picks} == {T}  # qkv, o, gate_up, down and the lm_head shapes
    torch.testing.assert_close(outs[True], outs[False], atol=3e-2, rtol=3e-2)
    calls = []
    original = tuning.captured_time_us
    tuning.captured_time_us = lambda fn, reps: calls.append(1) or original(fn, reps)
    try:
        dec(tokens, positions, mask, torch.arange(T).cuda(), cache.layers, ())
    finally:
        tuning.captured_time_us = original
    assert calls == []  # every shape kept: nothing timed again
