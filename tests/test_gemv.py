"""linear_rows: the few-row linear kernel against F.linear, and the fused decoder running on it."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model

from specdec.fused import FusedDecoder
from specdec.kernels import (
                             GEMV_MAX_ROWS,
                             gemv_config,
                             interpreter_enabled,
                             kernel_mode,
                             linear_rows,
                             linear_rows_ref,
                             triton_available,
)
from specdec.kernels.gemv import _linear_rows_triton
from specdec.static import slot_cache

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not triton_available(), reason="triton does not import")
needs_interpreter = pytest.mark.skipif(not (triton_available() and interpreter_enabled()),
                                       reason="the kernel on CPU tensors needs the Triton interpreter")


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,n,k,bias", [(1, 40, 70, True), (3, 33, 129, False), (16, 20, 64, True),
                                           (5, 2100, 96, False)])
def test_the_kernel_equals_f_linear(device, rows, n, k, bias):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=g).to(device)
    w = torch.randn(n, k, generator=g).to(device)
    b = torch.randn(n, generator=g).to(device) if bias else None
    y = _linear_rows_triton(x, w, b)
    assert y.shape == (rows, n) and y.dtype == x.dtype
    torch.testing.assert_close(y, linear_rows_ref(x, w, b), atol=1e-4, rtol=1e-4)


@needs_interpreter
def test_leading_dims_strided_inputs_and_forced_configs_give_the_same_result():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 50, generator=g)[:, 1:2]  # [2, 1, 50], not contiguous across rows
    w = torch.randn(24, 100, generator=g)[:, ::2]   # a strided weight is made contiguous
    want = linear_rows_ref(x, w)
    for config in (None, (4, 32, 4), (8, 128, 8)):
        with kernel_mode("triton"):
            y = linear_rows(x, w, config=config)
        assert y.shape == (2, 1, 24)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)


def test_more_rows_than_the_kernel_takes_run_f_linear_and_bad_inputs_are_named():
    x, w = torch.randn(GEMV_MAX_ROWS + 1, 8), torch.randn(5, 8)
    with kernel_mode("triton"):  # forced, yet too many rows: the reference
        torch.testing.assert_close(linear_rows(x, w), torch.nn.functional.linear(x, w))
    with pytest.raises(ValueError, match=r"weight must have shape \[N, K\]"):
        linear_rows(x, torch.randn(5, 9))
    with pytest.raises(ValueError, match="share a dtype"):
        linear_rows(x, w.double())
    with pytest.raises(ValueError, match=r"bias must have shape \[N\]"):
        linear_rows(x, w, torch.randn(4))


def test_configs_fill_the_gpu_and_bound_the_partial_products():
    for rows in (1, 2, 4, 16):
        for n, k in ((4096, 4096), (32000, 4096), (4096, 11008), (40, 70)):
            block_n, block_k, warps = gemv_config(rows, n, k)
            assert block_n * block_k * (1 << (rows - 1).bit_length()) <= 8192 * 2
            assert block_k & (block_k - 1) == 0 and warps in (4, 8)


@needs_interpreter
@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_decoder_on_the_kernel_equals_it_on_f_linear(batch):
    model = tiny_model("llama")
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    S = 16
    shapes = [((batch, config.num_key_value_heads, S, head_dim), torch.float32)] * config.num_hidden_layers
    tokens = torch.randint(0, VOCAB, (batch, 1), generator=torch.Generator().manual_seed(5))
    positions = torch.full((batch, 1), 3)
    mask = torch.zeros(batch, 1, 1, S)
    mask[..., 4:] = torch.finfo(torch.float32).min
    outs = []
    for rows, mode in ((0, "auto"), (GEMV_MAX_ROWS, "triton")):
        dec = FusedDecoder(model, max_positions=32, gemv_rows=rows)
        cache = slot_cache(shapes, torch.device("cpu"))
        with kernel_mode(mode):
            outs.append(dec(tokens, positions, mask, torch.tensor([3]), cache.layers, (1,)))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1][1][0], outs[0][1][0], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_the_gemv_benchmark_says_it_needs_a_gpu(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "bench_gemv.py"
    spec = importlib.util.spec_from_file_location("bench_gemv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--no-decoder"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
