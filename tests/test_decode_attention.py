"""decode_attention: one query per row over a static cache, split along the keys, against SDPA."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.fused import FusedDecoder, decode_kernels
from specdec.kernels import (
                             decode_attention,
                             decode_attention_ref,
                             decode_split,
                             interpreter_enabled,
                             kernel_mode,
                             triton_available,
)
from specdec.kernels.decode_attention import _decode_attention_triton
from specdec.static import slot_cache

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES or not triton_available(), reason="needs triton on CUDA or interpreted")


def _case(B, H, Hkv, S, d, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H + 1, 1, d, generator=g)[:, :H]  # a view: q's heads are strided as in the decoder
    k, v = torch.randn(B, Hkv, S, d, generator=g), torch.randn(B, Hkv, S, d, generator=g)
    mask = torch.zeros(B, 1, 1, S)
    for b in range(B):  # each row hides a different prefix (left padding) and suffix (free slots)
        mask[b, ..., :b] = torch.finfo(torch.float32).min
        mask[b, ..., S - 3 - 5 * b:] = torch.finfo(torch.float32).min
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, mask)]


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,H,Hkv,S,d,block", [(1, 4, 4, 37, 16, None), (2, 8, 2, 100, 32, 16), (3, 4, 1, 64, 8, 32),
                                               (2, 2, 2, 300, 64, None)])
def test_the_kernel_equals_sdpa(device, B, H, Hkv, S, d, block):
    q, k, v, mask = _case(B, H, Hkv, S, d, seed=S, device=device)
    out = _decode_attention_triton(q, k, v, mask, 0.3, block)
    assert out.shape == (B, H, 1, d) and out.dtype == q.dtype
    torch.testing.assert_close(out, decode_attention_ref(q, k, v, mask, 0.3), atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_whole_chunks_hidden_and_a_mask_shared_by_the_rows_are_handled(device):
    q, k, v, _ = _case(2, 4, 2, 96, 16, device=device)
    mask = torch.full((1, 1, 1, 96), torch.finfo(torch.float32).min, device=device)
    mask[..., 40:45] = 0.0  # only 5 keys visible: every other 16-key chunk is hidden whole
    out = _decode_attention_triton(q, k, v, mask, None, 16)
    torch.testing.assert_close(out, decode_attention_ref(q, k, v, mask), atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="bf16 on the GPU")
def test_bf16_on_the_gpu_stays_close_to_sdpa():
    q, k, v, mask = _case(2, 32, 8, 700, 128, device="cuda", dtype=torch.bfloat16)
    out = decode_attention(q, k, v, mask)
    torch.testing.assert_close(out.float(), decode_attention_ref(q, k, v, mask).float(), atol=2e-2, rtol=2e-2)


def test_bad_inputs_are_named_and_the_split_is_bounded():
    q, k, v, mask = _case(2, 4, 2, 20, 8)
    with pytest.raises(ValueError, match=r"one query per row"):
        decode_attention(q.expand(2, 4, 2, 8), k, v, mask)
    with pytest.raises(ValueError, match=r"multiple of key/value heads"):
        decode_attention(q[:, :3], k, v, mask)
    with pytest.raises(ValueError, match=r"mask must be additive"):
        decode_attention(q, k, v, mask[..., :10])
    with pytest.raises(ValueError, match=r"float \(additive\) mask"):
        decode_attention(q, k, v, mask == 0)
    with pytest.raises(ValueError, match=r"one shape"):
        decode_attention(q, k, v[:, :, :10], mask)
    for bh, keys in ((1, 10), (32, 704), (512, 704), (4096, 8192)):
        block = decode_split(bh, keys)
        assert 16 <= block <= 256 and block & (block - 1) == 0


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_decoder_attends_one_token_with_the_kernel_as_with_sdpa(batch, device):
    model = tiny_model("llama").to(device)  # grouped-query attention (4 query heads, 2 key/value heads)
    config = model.config
    assert config.num_key_value_heads < config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    S = 40
    shapes = [((batch, config.num_key_value_heads, S, head_dim), torch.float32)] * config.num_hidden_layers
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, VOCAB, (batch, 20), generator=g).to(device)
    tokens = torch.randint(0, VOCAB, (batch, 1), generator=g).to(device)
    mask = torch.zeros(batch, 1, 1, S, device=device)
    mask[..., 21:] = torch.finfo(torch.float32).min
    outs = []
    for attention, mode in ((False, "auto"), (True, "triton")):
        with decode_kernels(attention=attention, gemv_rows=0, fused_ops=False):
            dec = FusedDecoder(model, max_positions=64)
        assert dec.decode_attention is attention and dec.gemv_rows == 0
        cache = slot_cache(shapes, torch.device(device))
        dec.prefill(prefix, torch.ones_like(prefix, dtype=torch.bool), cache.layers, all_valid=True)
        with kernel_mode(mode):
            outs.append(dec(tokens, torch.full((batch, 1), 20, device=device), mask,
                            torch.tensor([20], device=device), cache.layers, (1,)))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1][1][0], outs[0][1][0], atol=1e-5, rtol=1e-5)


def test_decode_kernels_restores_the_defaults_and_names_bad_values():
    model = tiny_model("llama")
    before = FusedDecoder(model, max_positions=8)
    with decode_kernels(gemv_rows=0, attention=False):
        inside = FusedDecoder(model, max_positions=8)
    after = FusedDecoder(model, max_positions=8)
    assert (inside.gemv_rows, inside.decode_attention) == (0, False)
    assert (after.gemv_rows, after.decode_attention) == (before.gemv_rows, before.decode_attention) == (1, False)
    assert before.fused_ops is after.fused_ops is True  # the measured defaults: fused ops on, split-key attention off
    with pytest.raises(ValueError, match="gemv_rows must be an int >= 0"):
        with decode_kernels(gemv_rows=-1):
            pass
    with pytest.raises(ValueError, match="attention must be True, False or None"):
        with decode_kernels(attention="yes"):
            pass


def test_decode_kernels_sets_the_capture_blas_library_for_its_block_and_names_bad_values():
    """decode_kernels(blas=) is what captures pick GEMMs from (specdec.graphs.capture_blas), restored after the
    block, also when the block raises; the decoders and decode_settings() report it; bad names are refused."""
    from specdec.fused import decode_settings
    from specdec.graphs import capture_blas, use_capture_blas

    model = tiny_model("llama")
    assert capture_blas() == decode_settings()["blas"] == FusedDecoder(model, max_positions=8).blas == "cublaslt"
    with decode_kernels(blas="cublas"):
        assert capture_blas() == decode_settings()["blas"] == "cublas"
        assert FusedDecoder(model, max_positions=8).settings["blas"] == "cublas"
        with decode_kernels(fused_ops=False):  # another setting leaves the library alone
            assert capture_blas() == "cublas"
    assert capture_blas() == "cublaslt"
    with pytest.raises(RuntimeError, match="inside"):
        with decode_kernels(blas="torch"):
            assert capture_blas() == "torch"
            raise RuntimeError("inside")
    assert capture_blas() == "cublaslt"
    with pytest.raises(ValueError, match="blas must be one of"):
        with decode_kernels(blas="cublasLt"):
            pass
    with pytest.raises(ValueError, match="capture BLAS library must be one of"):
        use_capture_blas("mkl")
    assert capture_blas() == "cublaslt"
