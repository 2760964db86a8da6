"""4-bit draft heads: the packing and its layout, the 4-bit linear against its reference (interpreter and GPU), the
Int4Linear module and quantize_int4_, and the fused inference path on 4-bit layers. Decoding with a 4-bit head
stays lossless: test_fp8.py's decoding tests run both formats."""
from __future__ import annotations

import pytest
import torch
from test_fp8 import _head
from tiny_models import VOCAB, assert_replay_equals_a_call, tiny_model

from specdec.kernels import (
    INT4_GROUPS,
    Fp8Rows,
    Int4Weight,
    int4_linear_config,
    interpreter_enabled,
    kernel_mode,
    linear_int4,
    linear_int4_ref,
    linear_int4_rows,
    linear_int4_rows_ref,
    pack_int4,
    quantize_fp8_rows,
    quantize_fp8_rows_ref,
    triton_available,
    unpack_int4,
)
from specdec.nn import Int4Linear, quantize_fp8_, quantize_int4_
from specdec.nn.inference import cat_linears, fused_linear, inference_linear

needs_interpreter = pytest.mark.skipif(not (triton_available() and interpreter_enabled()),
                                       reason="the kernels on CPU tensors need the Triton interpreter")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA + triton")


@pytest.mark.parametrize("group", INT4_GROUPS)
def test_packing_rounds_each_group_to_fifteen_symmetric_levels(group):
    g = torch.Generator().manual_seed(group)
    w = torch.randn(6, 4 * group, generator=g) * torch.logspace(-3, 1, 6)[:, None]
    w[2, :group] = 0.0  # an all-zero group
    packed = pack_int4(w, group)
    assert packed.codes.shape == (6, 2 * group) and packed.codes.dtype == torch.uint8
    assert packed.scales.shape == (4, 6) and packed.group == group
    back = unpack_int4(packed)
    scale = w.view(6, 4, group).abs().amax(-1) / 7  # [rows, groups]
    step = scale.repeat_interleave(group, dim=1)
    assert bool(((back - w).abs() <= step / 2 + 1e-7).all())  # round to nearest
    levels = back / torch.where(step > 0, step, 1.0)
    assert bool(((levels - levels.round()).abs() < 1e-5).all()) and int(levels.round().abs().max()) == 7
    assert not back[2, :group].any()
    torch.testing.assert_close(back.abs().view(6, 4, group).amax(-1), scale * 7)  # each group's largest is kept


def test_the_layout_puts_a_chunks_two_groups_in_one_bytes_halves():
    """Chunk of 2 * 32 inputs: byte j holds input j (low half) and input 32 + j (high); a code is a sign bit (8)
    and a magnitude; the stored scales carry 2^9."""
    w = torch.zeros(1, 64)
    w[0, 0], w[0, 32], w[0, 1], w[0, 33] = 7.0, -7.0, -2.0, 3.0
    w[0, 2], w[0, 34] = 1.0, 1.0  # the two groups' scales: 7/7 = 1
    codes, scales, _ = pack_int4(w, 32)
    assert codes[0, :3].tolist() == [7 | (15 << 4), 10 | (3 << 4), 1 | (1 << 4)]
    assert scales[:, 0].tolist() == [512.0, 512.0]


@needs_interpreter
@pytest.mark.parametrize("rows,n,k,group,bias,config", [
    (10, 96, 256, 128, False, None),
    (7, 64, 512, 64, True, (64, 3, 4, 3, 1)),  # K split in 3 over 4 chunks: uneven
    (7, 64, 768, 64, True, (64, 2, 4, 3, 2)),  # 6 chunks, 2 a step: splits of 4 and 2
    (3, 80, 128, 32, True, (32, 2, 4, 2, 1)),
    (70, 64, 256, 32, False, None),  # two row blocks; 4 chunks a step
    (5, 48, 1536, 32, False, (32, 3, 4, 2, 4)),  # 24 chunks, 4 a step, split in 3
    (2, 40, 192, 32, False, (32, 1, 4, 2, 4)),  # 3 chunks: not a whole number of steps of 4, so one at a time
    (1, 33, 64, 32, False, None),
    (4, 40, 200, 64, True, None),  # K 200 of a 256-wide padded row: the last chunk partly past K
    (6, 24, 864, 32, False, (32, 2, 4, 2, 4)),  # 14 chunks for 13.5: one at a time, the last half past K
])
def test_the_kernel_equals_the_reference(rows, n, k, group, bias, config):
    g = torch.Generator().manual_seed(rows * n)
    weight = pack_int4(torch.randn(n, k, generator=g) * 0.05, group)
    x = torch.randn(rows, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    with kernel_mode("triton"):
        y = linear_int4(x, weight, b, config=config)
    want = linear_int4_ref(x, weight, b)
    torch.testing.assert_close(y, want, atol=1e-6 * float(want.abs().max()), rtol=0)
    with kernel_mode("triton"):  # rows rounded already: the product alone
        torch.testing.assert_close(linear_int4_rows(Fp8Rows.of(x), weight, b, config=config), y)


def test_the_reference_is_the_float8_rows_times_the_unpacked_weight():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 128, generator=g)
    x = torch.randn(2, 3, 128, generator=g).to(torch.bfloat16)
    packed = pack_int4(w, 64)
    q, s = quantize_fp8_rows_ref(x)
    want = ((q.double() * s.double()[..., None]) @ unpack_int4(packed).double().T).to(torch.bfloat16)
    assert torch.equal(linear_int4_ref(x, packed), want) and want.shape == (2, 3, 12)
    assert torch.equal(linear_int4_rows_ref(Fp8Rows(q, s, x.dtype), packed), want)


def test_a_width_that_is_not_a_multiple_of_two_groups_is_padded_with_zero_weights():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(12, 200, generator=g)
    packed = pack_int4(w, 64)  # K_pad 256
    assert packed.codes.shape == (12, 128) and packed.scales.shape == (4, 12)
    assert not unpack_int4(packed)[:, 200:].any() and unpack_int4(packed, 200).shape == (12, 200)
    torch.testing.assert_close(unpack_int4(packed, 200)[:, :128], unpack_int4(pack_int4(w[:, :128], 64)))


def test_bad_arguments_are_refused_with_the_fix():
    w = torch.randn(8, 192)
    with pytest.raises(ValueError, match="one of"):
        pack_int4(w, 48)
    with pytest.raises(ValueError, match="no inputs"):
        pack_int4(torch.randn(3, 0), 32)
    with pytest.raises(ValueError, match="inf or nan"):
        pack_int4(torch.full((2, 64), float("inf")), 32)
    with pytest.raises(ValueError, match="2-D float"):
        pack_int4(torch.ones(64, dtype=torch.int64), 32)
    packed = pack_int4(w, 32)
    with pytest.raises(ValueError, match="K=64.*pack_int4 of an \\[N, 64\\] weight"):
        linear_int4(torch.randn(2, 64), packed)
    with pytest.raises(ValueError, match="bias must have shape"):
        linear_int4(torch.randn(2, 192), packed, torch.zeros(3))
    with pytest.raises(ValueError, match="Int4Weight"):
        linear_int4(torch.randn(2, 192), (packed.codes, packed.scales))
    with pytest.raises(ValueError, match="float tensor"):
        linear_int4(torch.ones(2, 192, dtype=torch.int64), packed)


def test_configs_split_k_until_about_two_programs_per_multiprocessor():
    assert int4_linear_config(10, 22016, 4096) == (64, 1, 4, 3, 1)  # [gate; up]: 344 blocks
    assert int4_linear_config(10, 22016, 4096, 32)[4] == 4  # 128 bytes of a row a step
    assert int4_linear_config(10, 12288, 4096)[1] == 2  # [q; k; v]: 192
    assert int4_linear_config(10, 4096, 11008)[1] == 4  # down_proj: 64
    assert int4_linear_config(10, 64, 256)[1] == 1  # one chunk of 256: nothing to split


def test_int4_linear_stores_bytes_that_survive_dtype_casts_and_checks_its_widths():
    lin = torch.nn.Linear(128, 24, bias=True)
    layer = Int4Linear.from_linear(lin, group=64)
    assert (layer.in_features, layer.out_features, layer.group) == (128, 24, 64)
    assert "group=64" in repr(layer)
    before = [t.clone() for t in layer.stored()]
    layer.to(torch.bfloat16)  # buffers of integer dtype are not converted
    assert all(torch.equal(a, b) for a, b in zip(before, layer.stored()))
    assert set(layer.state_dict()) == {"weight_codes", "scale_bits", "bias"}
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x), linear_int4_ref(x, pack_int4(lin.weight, 64), lin.bias.to(x.dtype)))
    with pytest.raises(ValueError, match="group must be one of"):
        Int4Linear(torch.randn(4, 384), group=100)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=2, scale=4.0)


def test_quantize_int4_replaces_the_linears_and_the_eagle1_lm_head(target):
    head = _head(target)
    names = [n for n, m in head.named_modules() if type(m) is torch.nn.Linear]
    assert quantize_int4_(head, group=32, skip=("fc",)) is head
    assert type(head.fc) is torch.nn.Linear
    assert all(type(head.get_submodule(n)) is Int4Linear for n in names if n != "fc")
    assert isinstance(head.lm_head_fp8, Int4Linear) and head.lm_head_fp8.out_features == VOCAB
    assert not any(k.startswith("lm_head_fp8") for k in head.state_dict())
    h = torch.randn(1, 3, head.config.hidden_size)
    torch.testing.assert_close(head.logits(h), linear_int4_ref(h, pack_int4(head.lm_head_weight, 32)))
    with pytest.raises(ValueError, match="restrict the vocabulary first"):
        head.restrict_vocab(torch.arange(10))


def test_quantize_int4_pads_narrow_layers_and_refuses_bad_groups_changing_nothing(target):
    head = quantize_int4_(_head(target), group=128)  # hidden 64: every input padded to 256
    assert head.layers[0].self_attn.q_proj.weight_codes.shape[1] == 128
    h = torch.randn(2, head.config.hidden_size)
    torch.testing.assert_close(head.logits(h), linear_int4_ref(h, pack_int4(head.lm_head_weight, 128)))
    head = _head(target)
    with pytest.raises(ValueError, match="group must be one of"):
        quantize_int4_(head, group=16)
    with pytest.raises(ValueError, match="require gradients"):
        quantize_int4_(_head(target).requires_grad_(True), group=32)


def test_fused_blocks_concatenate_4bit_layers_and_refuse_mixed_formats(target):
    head = quantize_int4_(_head(target), group=32)
    mlp = head.layers[0].mlp
    weight, bias = fused_linear(mlp, ("gate_proj", "up_proj"))
    assert isinstance(weight, Int4Weight) and bias is None and weight.group == 32
    assert torch.equal(weight.codes, torch.cat([mlp.gate_proj.weight_codes, mlp.up_proj.weight_codes]))
    assert torch.equal(unpack_int4(weight), torch.cat([unpack_int4(mlp.gate_proj.int4_weight),
                                                       unpack_int4(mlp.up_proj.int4_weight)]))
    x = torch.randn(4, 64)
    torch.testing.assert_close(inference_linear(x, weight), torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], -1))
    other = quantize_fp8_(_head(target))
    attn = head.layers[0].self_attn
    with pytest.raises(ValueError, match="mix weight formats"):
        cat_linears((attn.q_proj, other.layers[0].self_attn.k_proj))


@needs_cuda
@pytest.mark.parametrize("rows", [1, 10, 61, 100])
@pytest.mark.parametrize("n,k,group,bias", [(4096, 4096, 128, False), (4096, 11008, 64, True),
                                            (12288, 4096, 32, False), (512, 1024, 128, True)])
def test_on_the_gpu_the_kernel_equals_the_reference_and_replays_in_a_graph(rows, n, k, group, bias):
    g = torch.Generator(device="cuda").manual_seed(rows + n + group)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16)
    weight = pack_int4(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5, group)
    b = torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16) if bias else None
    y = linear_int4(x, weight, b)
    q, s = quantize_fp8_rows(x)
    want = linear_int4_rows_ref(Fp8Rows(q, s, torch.float32), weight, None if b is None else b.float())
    torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=2e-2)
    assert_replay_equals_a_call(lambda: linear_int4(x, weight, b), x,
                                torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16))
