"""The fused decoder's element-wise kernels (add + RMSNorm, RoPE + KV write, SiLU-mul) against their references,
and the fused decoder and fast path running on every decode kernel."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.fused import FusedDecoder, decode_kernels
from specdec.generate import generate
from specdec.kernels import (
                             add_rms_norm,
                             add_rms_norm_ref,
                             embed_concat,
                             embed_concat_ref,
                             interpreter_enabled,
                             kernel_mode,
                             rope_store,
                             rope_store_ref,
                             silu_mul,
                             silu_mul_ref,
                             triton_available,
)
from specdec.static import slot_cache

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES or not triton_available(), reason="needs triton on CUDA or interpreted")


def _randn(*shape, seed, device, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("residual", [True, False])
def test_add_rms_norm_equals_the_residual_add_then_hf_norm(device, residual):
    x = _randn(2, 3, 70, seed=1, device=device)
    r = _randn(2, 3, 70, seed=2, device=device) if residual else None
    w = _randn(70, seed=3, device=device)
    with kernel_mode("triton"):
        h, out = add_rms_norm(x, r, w, 1e-6)
    h_ref, out_ref = add_rms_norm_ref(x, r, w, 1e-6)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)
    torch.testing.assert_close(out, out_ref, atol=2e-6, rtol=1e-5)
    assert (h is x) == (not residual)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nh,nk,d", [(4, 2, 16), (2, 2, 16), (20, 2, 128)])  # the last: two blocks of 16 heads
def test_rope_store_rotates_q_and_k_and_writes_k_and_v_at_their_slots(device, nh, nk, d):
    B, M, S = 2, 3, 10
    qkv = _randn(B, M, nh + 2 * nk + 1, d, seed=4, device=device)[:, :, 1:]  # strided heads, as a view
    cos, sin = _randn(B, M, 1, d, seed=5, device=device), _randn(B, M, 1, d, seed=6, device=device)
    slots = torch.tensor([5, 2, 7], device=device)
    caches = [torch.zeros(B, nk, S, d, device=device) for _ in range(4)]
    with kernel_mode("triton"):
        q = rope_store(qkv, cos, sin, caches[0], caches[1], slots, nh)
    q_ref = rope_store_ref(qkv, cos, sin, caches[2], caches[3], slots, nh)
    assert q.shape == q_ref.shape == (B, nh, M, d)
    torch.testing.assert_close(q, q_ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(caches[0], caches[2], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(caches[1], caches[3], atol=0, rtol=0)
    assert caches[0][:, :, [0, 1, 3, 4, 6, 8, 9]].abs().sum() == 0  # nothing outside the slots


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_rope_store_with_per_row_slots_and_a_plain_sin_matches_apply_rotary(device):
    """The draft heads' call: RotaryEmbedding's [B, 1, M, d] tables (sin not negated), one slot per row and token."""
    from specdec.nn import RotaryEmbedding, apply_rotary

    B, M, S, nh, nk, d = 2, 3, 9, 4, 2, 16
    qkv = _randn(B, M, nh + 2 * nk, d, seed=8, device=device)
    positions = torch.tensor([[4, 5, 6], [0, 1, 2]], device=device)
    cos, sin = RotaryEmbedding(d).to(device)(positions, torch.float32)  # [B, 1, M, d]
    slots = torch.tensor([[4, 5, 6], [8, 1, 2]], device=device)
    caches = [torch.zeros(B, nk, S, d, device=device) for _ in range(4)]
    with kernel_mode("triton"):
        q = rope_store(qkv, cos, sin, caches[0], caches[1], slots, nh, signed=False)
    q_ref = rope_store_ref(qkv, cos, sin, caches[2], caches[3], slots, nh, signed=False)
    heads = qkv.transpose(1, 2)  # [B, nh + 2 nk, M, d]
    q_nn, k_nn = apply_rotary(heads[:, :nh], cos, sin), apply_rotary(heads[:, nh:nh + nk], cos, sin)
    for got in (q, q_ref):
        torch.testing.assert_close(got, q_nn, atol=1e-6, rtol=1e-5)
    for keys, values in (caches[:2], caches[2:]):
        for b in range(B):
            torch.testing.assert_close(keys[b][:, slots[b]], k_nn[b], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(values[b][:, slots[b]], heads[b, nh + nk:], atol=0, rtol=0)
        assert keys[0][:, [0, 1, 2, 3, 7, 8]].abs().sum() == 0 and keys[1][:, [0, 3, 4, 5, 6, 7]].abs().sum() == 0


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_silu_mul_equals_silu_gate_times_up(device):
    gate_up = _randn(2, 3, 2 * 1100, seed=7, device=device)  # wider than one program's block
    with kernel_mode("triton"):
        out = silu_mul(gate_up)
    torch.testing.assert_close(out, silu_mul_ref(gate_up), atol=1e-6, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_concat_equals_the_embedding_then_a_concatenation(device, dtype):
    table = _randn(50, 1100, seed=8, device=device, dtype=dtype)  # rows wider than one program's block
    ids = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(9)).to(device)
    hidden = _randn(2, 3, 700, seed=10, device=device, dtype=dtype)[:, :, :600]  # strided rows
    with kernel_mode("triton"):
        out = embed_concat(ids, table, hidden)
    assert out.shape == (2, 3, 1700) and out.dtype == dtype
    assert torch.equal(out, embed_concat_ref(ids, table, hidden))
    with pytest.raises(ValueError, match="leading shape"):
        embed_concat(ids, table, hidden[:1])


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_rows_and_last_rows_equal_the_torch_ops_they_replace(device, dtype):
    """The EAGLE drafter's RoPE rows (a clamp and a gather, one launch) and its update's last real entries (a clamp,
    a gather, a compare and a where, one launch): bit for bit, stale positions and rows without an entry included."""
    from specdec.kernels import last_rows, last_rows_ref, table_rows, table_rows_ref

    table = _randn(40, 2, 1100, seed=11, device=device, dtype=dtype)  # rows wider than one program's block
    positions = torch.tensor([[0, 39, 41, -3], [5, 5, 7, 100]], device=device)  # past both ends: clamped
    with kernel_mode("triton"):
        got = table_rows(table, positions)
    assert got.shape == (2, 4, 2, 1100) and torch.equal(got, table_rows_ref(table, positions))
    assert torch.equal(got[0, 2], table[39]) and torch.equal(got[0, 3], table[0])
    x = _randn(3, 5, 1300, seed=12, device=device, dtype=dtype)[:, :, :1200]  # strided rows
    fallback = _randn(3, 1200, seed=13, device=device, dtype=torch.float32)
    last = torch.tensor([4, -1, 0], device=device)
    with kernel_mode("triton"):
        picked = last_rows(x, last, fallback)
    assert torch.equal(picked, last_rows_ref(x, last, fallback)) and picked.dtype == dtype
    assert torch.equal(picked[1], fallback[1].to(dtype)) and torch.equal(picked[0], x[0, 4])
    with pytest.raises(ValueError, match="fallback \\[B, H\\]"):
        last_rows(x, last, fallback[:, :5])


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_slots", [True, False])
def test_decoder_inputs_equal_the_embedding_rope_gathers_and_key_end_they_replace(device, dtype, with_slots):
    """The fused decoder's inputs in one launch: the embeddings (ids clamped into the table), the RoPE rows at the
    positions and ``max(slots) + 1``, bit for bit against the torch ops of the former code."""
    from specdec.kernels import decoder_inputs, decoder_inputs_ref

    embed = _randn(50, 1100, seed=21, device=device, dtype=dtype)  # rows wider than one program's block
    cos, sin = _randn(64, 6, seed=22, device=device), _randn(64, 6, seed=23, device=device)
    tokens = torch.tensor([[3, 49, 50, -2], [0, 7, 7, 120]], device=device)  # past both ends: clamped
    positions = torch.tensor([[0, 63, 5, 2], [9, 9, 70, -1]], device=device)
    slots = torch.tensor([17, 12, 30, 4, 29], device=device) if with_slots else None
    with kernel_mode("triton"):
        h, c, s, end = decoder_inputs(tokens, positions, embed, cos, sin, slots)
    ref = decoder_inputs_ref(tokens, positions, embed, cos, sin, slots)
    for got, want in zip((h, c, s), ref[:3]):
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(h[0, 1], embed[49]) and torch.equal(h[0, 2], embed[49]) and torch.equal(h[0, 3], embed[0])
    assert torch.equal(c[1, 2], cos[63]) and torch.equal(s[1, 3], sin[0])
    in_range = (tokens >= 0) & (tokens < 50)
    assert torch.equal(h[in_range], torch.nn.functional.embedding(tokens[in_range], embed))
    if with_slots:
        assert end.tolist() == [31] and end.dtype == slots.dtype
    else:
        assert end is None and ref[3] is None
    with pytest.raises(ValueError, match="decoder_inputs"):
        decoder_inputs(tokens, positions[:, :2], embed, cos, sin, slots)


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="bf16 on the GPU")
def test_bf16_results_are_within_one_unit_of_the_references_on_the_gpu():
    x, r = _randn(4, 4096, seed=1, device="cuda", dtype=torch.bfloat16), _randn(4, 4096, seed=2, device="cuda",
                                                                              dtype=torch.bfloat16)
    w = _randn(4096, seed=3, device="cuda", dtype=torch.bfloat16)
    h, out = add_rms_norm(x, r, w, 1e-5)
    h_ref, out_ref = add_rms_norm_ref(x, r, w, 1e-5)
    assert torch.equal(h, h_ref)
    torch.testing.assert_close(out.float(), out_ref.float(), atol=0, rtol=2 ** -7)
    gu = _randn(4, 2 * 11008, seed=4, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(silu_mul(gu).float(), silu_mul_ref(gu).float(), atol=1e-3, rtol=2 ** -7)


def test_bad_inputs_are_named():
    x, w = torch.randn(2, 8), torch.randn(8)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, torch.randn(2, 7), w, 1e-6)
    with pytest.raises(ValueError, match="weight must have shape"):
        add_rms_norm(x, None, torch.randn(7), 1e-6)
    qkv = torch.randn(1, 2, 8, 4)
    keys = torch.zeros(1, 2, 5, 4)
    with pytest.raises(ValueError, match="nh \\+ 2 \\* nk"):
        rope_store(qkv, torch.ones(1, 2, 4), torch.ones(1, 2, 4), keys, keys.clone(), torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="slots must have shape"):
        rope_store(qkv, torch.ones(1, 2, 4), torch.ones(1, 2, 4), keys, keys.clone(), torch.tensor([0]), 4)
    with pytest.raises(ValueError, match="slots must have shape"):
        rope_store(qkv, torch.ones(1, 2, 4), torch.ones(1, 2, 4), keys, keys.clone(), torch.zeros(2, 2).long(), 4)
    with pytest.raises(ValueError, match="2 I"):
        silu_mul(torch.randn(3, 5))


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 5])
def test_the_fused_decoder_on_every_kernel_equals_it_on_torch_ops(M, device):
    """Prefill, then a forward of M tokens (one per row: the decode step; five: a tree), with every kernel forced
    (interpreted on CPU) against the same decoder on the torch references."""
    model = tiny_model("llama").to(device)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    B, T, S = 2, 12, 24
    shapes = [((B, config.num_key_value_heads, S, head_dim), torch.float32)] * config.num_hidden_layers
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, VOCAB, (B, T), generator=g).to(device)
    tokens = torch.randint(0, VOCAB, (B, M), generator=g).to(device)
    positions = T + torch.arange(M, device=device)[None].expand(B, M)
    mask = torch.full((B, 1, M, S), torch.finfo(torch.float32).min, device=device)
    mask[..., :T] = 0.0
    for j in range(M):
        mask[:, :, j, T + j] = 0.0
    outs = []
    for mode in ("torch", "triton"):
        dec = FusedDecoder(model, max_positions=64, decode_attention=True, fused_ops=True)
        cache = slot_cache(shapes, torch.device(device))
        with kernel_mode(mode):
            dec.prefill(prefix, torch.ones_like(prefix, dtype=torch.bool), cache.layers, all_valid=True)
            logits, feats = dec(tokens, positions, mask, T + torch.arange(M, device=device), cache.layers, (0, 1, 2))
        outs.append((logits, feats, cache.layers[1].keys.clone()))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=2e-5, rtol=1e-4)
    for mine, ref in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(mine, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(outs[1][2], outs[0][2], atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device,batch", [(d, b) for d in DEVICES for b in ((2,) if d == "cpu" else (1, 2))])
def test_the_fast_path_on_every_decode_kernel_decodes_as_plain_greedy_decoding(device, batch):
    """float32 greedy: generate(fast=True) with every decode kernel on (forced and interpreted on CPU; on CUDA
    captured in the graphs) gives the eager tokens; so it does with them off."""
    model = tiny_model("llama", scale=3.0).to(device)
    ids = torch.randint(0, VOCAB, (batch, 9), generator=torch.Generator().manual_seed(2)).to(device)
    eager = generate(model, ids, max_new_tokens=6, eos_token_id=[])
    mode = "triton" if device == "cpu" else "auto"
    with kernel_mode(mode):
        with decode_kernels(gemv_rows=16, attention=True, fused_ops=True):
            fast = generate(model, ids, max_new_tokens=6, eos_token_id=[], fast=True)
        with decode_kernels(gemv_rows=0, attention=False, fused_ops=False):
            plain_ops = generate(model, ids, max_new_tokens=6, eos_token_id=[], fast=True)
    assert torch.equal(fast.sequences, eager.sequences)
    assert torch.equal(plain_ops.sequences, eager.sequences)


def test_a_held_static_store_takes_new_decode_settings_and_captures_again():
    """generate(fast=...) keeps one static store per model on CUDA: a change of decode_kernels() between calls must
    reach its fused decoder (and drop the graphs captured with the old choice), never be ignored."""
    from specdec.static import StaticAdapter, capacity_for

    model = tiny_model("llama")
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    first = StaticAdapter(model, capacity=capacity_for(6, 8, 64))
    first.prefill(ids, torch.ones_like(ids, dtype=torch.bool))
    store = first._store
    held = store.buffers
    assert store.fused.settings == {"gemv_rows": 1, "skinny_rows": 16, "decode_attention": False, "fused_ops": True,
                                   "tree_attention": True, "tune_linears": True, "blas": "cublaslt"}
    with decode_kernels(fused_ops=False, attention=True, blas="cublas", skinny_rows=0, tune_linears=False):
        second = StaticAdapter(model, capacity=first.capacity)
        second._store = store  # as target_adapter() hands the held store to the next call's adapter
        second.prefill(ids, torch.ones_like(ids, dtype=torch.bool))
    assert store.fused.settings == {"gemv_rows": 1, "skinny_rows": 0, "decode_attention": True, "fused_ops": False,
                                   "tree_attention": True, "tune_linears": False, "blas": "cublas"}
    assert store.buffers is not held  # new buffers: no graph captured with the old kernels replays
    third = StaticAdapter(model, capacity=first.capacity)
    third._store = store
    third.prefill(ids, torch.ones_like(ids, dtype=torch.bool))
    assert store.fused.settings == {"gemv_rows": 1, "skinny_rows": 16, "decode_attention": False, "fused_ops": True,
                                   "tree_attention": True, "tune_linears": True, "blas": "cublaslt"}


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_a_one_token_prompt_with_padding_rows_prefills_on_the_kernels(device):
    """A prefill of one token per row with a mask over its T = 1 slots (not the cache's S) takes the decode
    attention path: the keys are cut to the prompt first."""
    model = tiny_model("llama").to(device)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shapes = [((2, config.num_key_value_heads, 8, head_dim), torch.float32)] * config.num_hidden_layers
    tokens = torch.tensor([[3], [5]], device=device)
    valid = torch.tensor([[True], [False]], device=device)  # a padding row: the mask path (not all_valid)
    outs = []
    for mode in ("torch", "triton"):
        dec = FusedDecoder(model, max_positions=16, decode_attention=True, fused_ops=True)
        cache = slot_cache(shapes, torch.device(device))
        with kernel_mode(mode):
            outs.append(dec.prefill(tokens, valid, cache.layers)[0])
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-4)
