"""linear_skinny: the tensor-core few-row linear kernel against F.linear; the switches that route the fused
decoder's and the draft heads' projections to it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import assert_replay_equals_a_call, tiny_model

import specdec.nn.inference as inference
from specdec.fused import FusedDecoder, decode_kernels, decode_settings
from specdec.kernels import interpreter_enabled, kernel_mode, triton_available
from specdec.kernels.skinny import (
    SKINNY_DEFAULT_ROWS,
    SKINNY_MAX_ROWS,
    _linear_skinny_triton,
    linear_skinny,
    linear_skinny_ref,
    skinny_config,
)
from specdec.nn import SwiGLU
from specdec.nn.inference import apply_linear, inference_linear, use_skinny_linear

needs_interpreter = pytest.mark.skipif(not (triton_available() and interpreter_enabled()),
                                       reason="the kernel on CPU tensors needs the Triton interpreter")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA + triton")


@needs_interpreter
@pytest.mark.parametrize("rows,n,k,bias,config", [
    (2, 64, 256, False, (64, 128, 1, 4, 2)),   # the fewest rows
    (10, 96, 256, True, (32, 64, 2, 4, 3)),    # a ragged last block of outputs, K split in two, a bias
    (61, 130, 384, False, (64, 128, 2, 4, 2)), # a verify's rows; K not a multiple of the split's chunk
    (7, 64, 200, True, (64, 64, 4, 4, 3)),     # K not a multiple of the block: masked loads
    (33, 40, 64, False, None),                 # the default config
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_kernel_equals_f_linear(rows, n, k, bias, config, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    y = _linear_skinny_triton(x, w, b, config)
    assert y.shape == (rows, n) and y.dtype == dtype
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.float(), want, atol=tol, rtol=tol)


@needs_interpreter
def test_leading_dims_and_strided_inputs_give_the_result_of_the_contiguous_ones():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, 64, generator=g, dtype=torch.float16)[:, 1:]   # [2, 2, 5, 64]: 20 rows, strided
    w = torch.randn(48, 128, generator=g, dtype=torch.float16)[:, ::2]      # a strided weight is made contiguous
    y = _linear_skinny_triton(x, w, None, (32, 32, 2, 4, 2))
    assert y.shape == (2, 2, 5, 48)
    torch.testing.assert_close(y.float(), F.linear(x.float(), w.float()), atol=2e-2, rtol=2e-2)


def test_dispatch_takes_the_reference_outside_the_kernels_range_and_names_bad_inputs(monkeypatch):
    calls = []
    monkeypatch.setattr("specdec.kernels.skinny._linear_skinny_triton", lambda *a: calls.append(a) or None)
    w16 = torch.randn(8, 16, dtype=torch.float16)
    with kernel_mode("triton" if triton_available() and interpreter_enabled() else "torch"):
        for x in (torch.randn(1, 16, dtype=torch.float16),                 # one row: linear_rows's case
                  torch.randn(SKINNY_MAX_ROWS + 1, 16, dtype=torch.float16),  # too many rows
                  torch.randn(4, 16)):                                      # float32: tensor cores would round
            w = w16.to(x.dtype)
            torch.testing.assert_close(linear_skinny(x, w), F.linear(x, w))
    assert not calls
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match=r"weight must have shape \[N, K\]"):
        linear_skinny(x, torch.randn(5, 9))
    with pytest.raises(ValueError, match="share a dtype"):
        linear_skinny(x, torch.randn(5, 16).double())
    with pytest.raises(ValueError, match=r"bias must have shape \[N\]"):
        linear_skinny(x, torch.randn(5, 16), torch.randn(4))
    torch.testing.assert_close(linear_skinny_ref(x, w16.float()), F.linear(x, w16.float()))


def test_configs_split_only_large_matrices_with_few_programs():
    assert skinny_config(10, 4096, 4096)[2] == 2        # o_proj: 64 programs -> split in two
    assert skinny_config(10, 22016, 4096)[2] == 1       # gate/up: 344 programs
    assert skinny_config(10, 8192, 4096)[2] == 1        # an FR-Spec lm_head: 128 programs
    assert skinny_config(10, 64, 256)[2] == 1           # small: one launch
    for rows in (2, 10, 61):
        for n, k in ((4096, 11008), (4096, 8192), (12288, 4096), (40, 70)):
            bn, bk, split, warps, stages = skinny_config(rows, n, k)
            assert bn & (bn - 1) == 0 and bk & (bk - 1) == 0 and split in (1, 2) and warps in (4, 8)
            assert split == 1 or k % (split * bk) == 0


def test_the_switches_are_checked_set_and_restored():
    assert decode_settings()["skinny_rows"] == SKINNY_DEFAULT_ROWS == inference._SKINNY_ROWS[0]
    with decode_kernels(skinny_rows=0):
        assert decode_settings()["skinny_rows"] == 0 == inference._SKINNY_ROWS[0]
    assert inference._SKINNY_ROWS[0] == SKINNY_DEFAULT_ROWS
    with pytest.raises(RuntimeError), decode_kernels(skinny_rows=64):
        assert inference._SKINNY_ROWS[0] == 64
        raise RuntimeError("inside")
    assert inference._SKINNY_ROWS[0] == SKINNY_DEFAULT_ROWS
    for bad in (-1, SKINNY_MAX_ROWS + 1, 2.0, True):
        with pytest.raises(ValueError, match="skinny_rows must be an int"):
            with decode_kernels(skinny_rows=bad):
                pass
        with pytest.raises(ValueError, match="max_rows must be an int"):
            use_skinny_linear(bad)


def _spy(monkeypatch) -> list:
    calls = []

    def spy(x, weight, bias=None):
        calls.append(x.numel() // x.shape[-1])
        return F.linear(x, weight, bias)

    monkeypatch.setattr(inference, "linear_skinny", spy)
    monkeypatch.setattr("specdec.fused.linear_skinny", spy)
    return calls


@needs_interpreter
def test_the_blocks_route_their_projections_by_rows_on_the_fused_inference_path(monkeypatch):
    calls = _spy(monkeypatch)
    mlp = SwiGLU(16, 24)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    with torch.no_grad(), kernel_mode("triton"):
        for rows in (1, 5, 17):
            x = torch.randn(1, rows, 16)
            torch.testing.assert_close(mlp(x), F.linear(F.silu(x @ mlp.gate_proj.weight.T) * (x @ mlp.up_proj.weight.T),
                                                        mlp.down_proj.weight), atol=1e-4, rtol=1e-4)
    assert calls == [5, 5]  # [gate; up] and down for 5 rows; one row and 17 rows (> 16) run F.linear
    calls.clear()
    with torch.no_grad(), kernel_mode("triton"), decode_kernels(skinny_rows=0):
        mlp(torch.randn(1, 5, 16))
    assert not calls
    x = torch.randn(3, 16)
    torch.testing.assert_close(inference_linear(x, mlp.gate_proj.weight), F.linear(x, mlp.gate_proj.weight))
    assert not calls  # gradients recorded: the modules as written
    hooked = torch.nn.Linear(16, 4)
    hooked.register_forward_hook(lambda *a: None)
    with torch.no_grad(), kernel_mode("triton"):
        apply_linear(hooked, x)
    assert not calls  # a hooked linear runs its own forward


@needs_interpreter
def test_the_fused_decoder_routes_by_rows(monkeypatch):
    calls = _spy(monkeypatch)
    dec = FusedDecoder(tiny_model("llama"), max_positions=16, skinny_rows=4)
    assert dec.settings["skinny_rows"] == 4
    w = torch.randn(8, 16)
    with kernel_mode("triton"):
        for rows in (1, 3, 4, 5):
            dec._linear(torch.randn(rows, 16), w, None)
    assert calls == [3, 4]


@needs_cuda
@pytest.mark.parametrize("rows", [2, 7, 10, 16, 61])
@pytest.mark.parametrize("n,k,bias", [(4096, 4096, False), (3000, 8192, True), (512, 1000, False)])
def test_on_the_gpu_the_kernel_equals_f_linear_and_replays_in_a_graph(rows, n, k, bias):
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16) if bias else None
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    y = linear_skinny(x, w, b)
    torch.testing.assert_close(y.float(), want, atol=3e-2, rtol=2e-2)
    assert_replay_equals_a_call(lambda: linear_skinny(x, w, b), x,
                                torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16))


def _split_products(device):
    """The three products that split ``K``, each as ``(name, fn(x) -> y)`` with a split forced."""
    from specdec.kernels import linear_fp8, linear_int4, pack_int4, quantize_fp8_rows
    g = torch.Generator().manual_seed(9)
    w = (torch.randn(80, 512, generator=g) * 0.05).to(device)
    b = torch.randn(80, generator=g).to(device)
    w8, ws = quantize_fp8_rows(w)
    w4 = pack_int4(w, 64)
    return [("skinny", lambda x: linear_skinny(x.to(torch.bfloat16), w.to(torch.bfloat16), b.to(torch.bfloat16),
                                               config=(32, 64, 3, 4, 2))),
            ("fp8", lambda x: linear_fp8(x, w8, ws, b, config=(32, 64, 4, 4, 2))),
            ("int4", lambda x: linear_int4(x, w4, b, config=(32, 3, 4, 2, 1)))]


@needs_interpreter
@pytest.mark.parametrize("rows", [3, 70])
def test_split_products_summed_in_the_launch_equal_the_summing_launch_bit_for_bit(rows):
    """use_split_fixup: each output tile's last program sums the partials (counted on a per-stream buffer that it
    leaves zeroed) in the summing kernel's order, so the results are the same bits and the launches one fewer."""
    from specdec.kernels import skinny
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    with kernel_mode("triton"):
        for name, fn in _split_products("cpu"):
            if name == "skinny" and rows > 64:
                continue  # the skinny kernel takes at most 64 rows
            previous = skinny.use_split_fixup(False)
            try:
                want = fn(x)
                skinny.use_split_fixup(True)
                got = fn(x)
            finally:
                skinny.use_split_fixup(previous)
            assert torch.equal(got, want), name
            assert not any(int(c.abs().sum()) for c in skinny._COUNTERS.values())
    with pytest.raises(ValueError, match="True or False"):
        skinny.use_split_fixup(1)


@needs_cuda
@pytest.mark.parametrize("rows", [10, 61])
def test_on_the_gpu_split_products_summed_in_the_launch_equal_the_summing_launch_and_replay(rows):
    from specdec.kernels import skinny
    x = torch.randn(rows, 512, device="cuda")
    for name, fn in _split_products("cuda"):
        previous = skinny.use_split_fixup(False)
        try:
            want = fn(x)
            skinny.use_split_fixup(True)
            for _ in range(3):
                assert torch.equal(fn(x), want), name
            assert_replay_equals_a_call(lambda fn=fn: fn(x), x, torch.randn(rows, 512, device="cuda"))
        finally:
            skinny.use_split_fixup(previous)
        torch.cuda.synchronize()
        assert not any(int(c.abs().sum()) for c in skinny._COUNTERS.values())
