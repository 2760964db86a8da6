"""Float8 draft heads: the row rounding and the float8 linear against their references, the Fp8Linear module and
quantize_fp8_, the fused inference path on float8 layers, and decoding that stays lossless with a rounded head (a
float8 one and a 4-bit one, ``ROUNDINGS``)."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from tiny_models import VOCAB, assert_replay_equals_a_call, tiny_model

from specdec import recipes
from specdec.drafters import EagleDrafter
from specdec.generate import generate
from specdec.heads import DFlashHead, DSparkHead, Eagle1Head, Eagle3Head, MedusaHead, PEagleHead
from specdec.kernels import interpreter_enabled, kernel_mode, triton_available
from specdec.kernels.decoder_ops import add_rms_norm, embed_concat, silu_mul
from specdec.kernels.fp8 import (
    FP8_DTYPE,
    Fp8Rows,
    _linear_fp8_triton,
    dequantize_fp8,
    fp8_linear_config,
    linear_fp8,
    linear_fp8_ref,
    linear_fp8_rows,
    linear_fp8_rows_ref,
    quantize_fp8_rows,
    quantize_fp8_rows_ref,
)
from specdec.nn import Fp8Linear, Fp8Weight, Int4Linear, quantize_fp8_, quantize_int4_
from specdec.nn.inference import cat_linears, fused_linear, inference_linear
from specdec.trees import DynamicTree

needs_interpreter = pytest.mark.skipif(not (triton_available() and interpreter_enabled()),
                                       reason="the kernels on CPU tensors need the Triton interpreter")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA + triton")

#: The head roundings the decoding tests run: float8, and 4-bit at 32 inputs per scale (the tiny heads' widths).
ROUNDINGS = [pytest.param(quantize_fp8_, id="fp8"),
             pytest.param(functools.partial(quantize_int4_, group=32), id="int4")]
_ROUNDED = (Fp8Linear, Int4Linear)


def _spread(rows: int, k: int, seed: int) -> torch.Tensor:
    """Rows whose entries span six decades (so that subnormal, normal and largest float8 values all occur)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=g) * torch.logspace(-4, 2, k)[torch.randperm(k, generator=g)]


def test_the_reference_rounding_is_within_e4m3_precision_and_keeps_zero_rows():
    x = _spread(6, 300, 0)
    x[2] = 0.0
    q, scale = quantize_fp8_rows_ref(x)
    assert q.dtype == FP8_DTYPE and q.shape == x.shape and scale.shape == (6,) and scale.dtype == torch.float32
    assert float(scale[2]) == 1.0 and not q[2].float().any()
    back = dequantize_fp8(q, scale)
    err = (back - x).abs()
    # relative 2^-4 for normal values; absolute half a subnormal step (2^-10 of the scale) below them
    assert bool((err <= x.abs() / 16 + scale[:, None] * 2.0 ** -10 + 1e-12).all())
    assert torch.equal(q.float().abs().amax(1)[[0, 1, 3, 4, 5]], torch.full((5,), 448.0))  # the whole range used


@needs_interpreter
@pytest.mark.parametrize("shape,dtype", [((10, 300), torch.float32), ((3, 5000), torch.float32),
                                         ((2, 4, 64), torch.float16), ((1, 7), torch.bfloat16),
                                         ((2, 20000), torch.float32)])  # past 16,384: read twice
def test_the_row_kernel_equals_the_reference_bit_for_bit(shape, dtype):
    x = _spread(int(torch.tensor(shape[:-1]).prod()), shape[-1], len(shape)).view(shape).to(dtype)
    x.view(-1, shape[-1])[0, :5] = 0.0
    with kernel_mode("triton"):
        q, scale = quantize_fp8_rows(x)
    want_q, want_scale = quantize_fp8_rows_ref(x)
    assert q.shape == x.shape and scale.shape == x.shape[:-1]
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(scale, want_scale)


@needs_interpreter
@pytest.mark.parametrize("rows,n,k,bias,config", [
    (1, 64, 256, False, None),                   # one row
    (10, 96, 512, True, (64, 128, 2, 4, 3)),     # a ragged block of outputs, K split in two, a bias
    (7, 64, 200, False, (64, 128, 1, 4, 2)),     # K not a multiple of the chunk: masked loads
    (70, 40, 128, True, None),                   # more rows than one program takes: two row blocks
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_linear_kernel_equals_the_reference(rows, n, k, bias, config, dtype):
    g = torch.Generator().manual_seed(rows * 100 + n)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w8, ws = quantize_fp8_rows_ref(torch.randn(n, k, generator=g) / k ** 0.5)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    y = _linear_fp8_triton(x, w8, ws, b, config)
    assert y.shape == (rows, n) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(y, linear_fp8_ref(x, w8, ws, b), atol=tol, rtol=tol)
    # and both are the unrounded product within float8's precision
    full = F.linear(x.float(), dequantize_fp8(w8, ws), None if b is None else b.float())
    assert float((y.float() - full).abs().max()) <= 0.1 * float(full.abs().max())


def test_linear_checks_its_arguments_and_takes_leading_dims():
    x = torch.randn(2, 3, 16)
    w8, ws = quantize_fp8_rows(torch.randn(8, 16))
    assert linear_fp8(x, w8, ws).shape == (2, 3, 8)
    torch.testing.assert_close(linear_fp8(x, w8, ws)[1], linear_fp8(x[1], w8, ws))
    with pytest.raises(ValueError, match="w8 must be"):
        linear_fp8(x, w8.float(), ws)
    with pytest.raises(ValueError, match="w_scale must be float32 of shape"):
        linear_fp8(x, w8, ws[:4])
    with pytest.raises(ValueError, match="K = x.shape"):
        linear_fp8(torch.randn(3, 12), w8, ws)
    with pytest.raises(ValueError, match="bias must have shape"):
        linear_fp8(x, w8, ws, torch.zeros(3))
    with pytest.raises(ValueError, match="float tensor"):
        quantize_fp8_rows(w8)
    with pytest.raises(ValueError, match="inf or nan"):
        quantize_fp8_rows_ref(torch.tensor([[1.0, float("nan")]]))


def test_configs_come_from_the_sweep():
    assert fp8_linear_config(10, 4096, 8192) == (64, 256, 2, 4, 5)     # the head's fc: K split
    assert fp8_linear_config(10, 4096, 11008) == (64, 256, 1, 4, 5)    # down_proj: one pass
    assert fp8_linear_config(10, 22016, 4096) == (64, 256, 1, 4, 3)    # [gate; up], [q; k; v]: 3 stages
    assert fp8_linear_config(10, 12288, 4096) == (64, 256, 1, 4, 3)
    assert fp8_linear_config(10, 8192, 4096) == (64, 256, 2, 4, 5)     # an FR-Spec lm_head: one wave, split
    assert fp8_linear_config(10, 4096, 4096) == (64, 256, 1, 4, 5)     # o_proj: not split
    assert fp8_linear_config(10, 32000, 4096) == (64, 256, 1, 4, 5)    # a full lm_head: 5 stages
    assert fp8_linear_config(3, 64, 200)[1] == 128


def test_fp8_linear_stores_bytes_that_survive_dtype_casts():
    lin = torch.nn.Linear(16, 8)
    layer = Fp8Linear.from_linear(lin)
    x = torch.randn(5, 16)
    want = linear_fp8_ref(x, *quantize_fp8_rows_ref(lin.weight.detach()), lin.bias.detach())
    torch.testing.assert_close(layer(x), want)
    codes, scales = layer.weight_codes.clone(), layer.scale_bits.clone()
    layer.to(torch.float16)
    assert torch.equal(layer.weight_codes, codes) and torch.equal(layer.scale_bits, scales)
    assert layer.bias.dtype == torch.float16 and layer(x.half()).dtype == torch.float16
    assert set(layer.state_dict()) == {"weight_codes", "scale_bits", "bias"}
    assert isinstance(layer.fp8_weight, Fp8Weight) and layer.fp8_weight.w8.dtype == FP8_DTYPE
    with pytest.raises(ValueError, match="2-D float tensor"):
        Fp8Linear(torch.zeros(3))


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_producers_round_their_rows_as_quantize_fp8_rows_does(dtype):
    """add_rms_norm / silu_mul / embed_concat with fp8_out: the codes and scales of quantize_fp8_rows applied to their
    plain output, from the same launch (kernels under the interpreter; the references in torch mode)."""
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(5, 96, generator=g) * 3).to(dtype), torch.randn(5, 96, generator=g).to(dtype)
    w = (torch.rand(96, generator=g) + 0.5).to(dtype)
    gate_up = torch.randn(2, 3, 160, generator=g).to(dtype)
    table, hid = torch.randn(20, 48, generator=g).to(dtype), torch.randn(2, 3, 40, generator=g).to(dtype)
    ids = torch.randint(0, 20, (2, 3), generator=g)
    wide = torch.randn(1, 2 * 16400, generator=g).to(dtype)  # past one program's row: silu_mul, then the rounding
    for mode in ("triton", "torch"):
        with kernel_mode(mode):
            pairs = ((add_rms_norm(x, r, w, 1e-6)[1], add_rms_norm(x, r, w, 1e-6, fp8_out=True)[1]),
                     (add_rms_norm(x, None, w, 1e-6)[1], add_rms_norm(x, None, w, 1e-6, fp8_out=True)[1]),
                     (silu_mul(gate_up), silu_mul(gate_up, fp8_out=True)),
                     (silu_mul(wide), silu_mul(wide, fp8_out=True)),
                     (embed_concat(ids, table, hid), embed_concat(ids, table, hid, fp8_out=True)))
        for plain, rounded in pairs:
            q, scale = quantize_fp8_rows_ref(plain)
            assert isinstance(rounded, Fp8Rows) and rounded.dtype == dtype and rounded.q.shape == plain.shape
            assert torch.equal(rounded.q.float(), q.float()) and torch.equal(rounded.scale, scale)
    assert add_rms_norm(x, r, w, 1e-6, fp8_out=True)[0].dtype == dtype  # the sum stays in the dtype


def test_a_product_on_rows_rounded_already_equals_linear_fp8():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g)
    w8, ws = quantize_fp8_rows(torch.randn(24, 64, generator=g) / 8)
    b = torch.randn(24, generator=g)
    for mode in ("triton", "torch") if interpreter_enabled() else ("torch",):
        with kernel_mode(mode):
            rows = Fp8Rows.of(x)
            torch.testing.assert_close(linear_fp8_rows(rows, w8, ws, b), linear_fp8(x, w8, ws, b))
            torch.testing.assert_close(linear_fp8_rows(rows, w8, ws), linear_fp8_rows_ref(rows, w8, ws))
    with pytest.raises(ValueError, match="rows must be Fp8Rows"):
        linear_fp8_rows((rows.q, rows.scale), w8, ws)
    with pytest.raises(ValueError, match="need a float8 or 4-bit weight"):
        inference_linear(rows, torch.randn(24, 64))
    layer = Fp8Linear(torch.randn(24, 64, generator=g), b)
    torch.testing.assert_close(layer(rows), layer(x))


def _head(target, cls=Eagle1Head, seed: int = 0):
    torch.manual_seed(seed)
    extra = {"feature_layers": (0, 1, 2)} if cls is Eagle3Head else {}
    head = cls.from_target(target, **extra).float()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.05)
    return head.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=2, scale=4.0)


def test_quantize_replaces_the_linears_and_the_eagle1_lm_head(target):
    head = _head(target)
    names = [n for n, m in head.named_modules() if type(m) is torch.nn.Linear]
    assert quantize_fp8_(head, skip=("fc",)) is head
    assert type(head.fc) is torch.nn.Linear
    assert all(type(head.get_submodule(n)) is Fp8Linear for n in names if n != "fc")
    assert isinstance(head.lm_head_fp8, Fp8Linear) and head.lm_head_fp8.out_features == VOCAB
    assert not any(k.startswith("lm_head_fp8") for k in head.state_dict())  # the target's projection: not saved
    h = torch.randn(1, 3, head.config.hidden_size)
    torch.testing.assert_close(head.logits(h), linear_fp8_ref(h, *quantize_fp8_rows_ref(head.lm_head_weight)))
    with pytest.raises(ValueError, match="restrict the vocabulary first"):
        head.restrict_vocab(torch.arange(10))
    with pytest.raises(ValueError, match="skip names no nn.Linear"):
        quantize_fp8_(_head(target), skip=("nope",))
    with pytest.raises(ValueError, match="require gradients"):
        quantize_fp8_(Eagle1Head.from_target(target))


def test_fused_blocks_of_mixed_layers_are_refused_and_fp8_ones_concatenate(target):
    head = quantize_fp8_(_head(target), skip=("layers.0.self_attn.k_proj",))
    attn = head.layers[0].self_attn
    with pytest.raises(ValueError, match="mix weight formats"):
        cat_linears((attn.q_proj, attn.k_proj))
    mlp = head.layers[0].mlp
    weight, bias = fused_linear(mlp, ("gate_proj", "up_proj"))
    assert isinstance(weight, Fp8Weight) and bias is None
    assert torch.equal(weight.w8.view(torch.uint8), torch.cat([mlp.gate_proj.weight_codes, mlp.up_proj.weight_codes]))
    assert fused_linear(mlp, ("gate_proj", "up_proj"))[0].w8.data_ptr() == weight.w8.data_ptr()  # cached


class _Spy(EagleDrafter):
    """Records the token of every draft node."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafts = []

    def propose(self, state, request):
        draft, state = super().propose(state, request)
        self.drafts.append(draft.tokens.clone())
        return draft, state


@needs_interpreter
@pytest.mark.parametrize("quantize", ROUNDINGS)
@pytest.mark.parametrize("cls", [Eagle1Head, Eagle3Head])
def test_the_fused_inference_path_drafts_as_the_modules_path_on_float8_layers(target, cls, quantize):
    """The fused path (concatenated float8 / 4-bit projections, the kernels under the interpreter) and the modules
    as written (Fp8Linear / Int4Linear.forward on the references) draft the same tokens."""
    head = quantize(_head(target, cls))
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    drafts, seqs = {}, {}
    for mode in ("torch", "triton"):
        spy = _Spy(head, DynamicTree(12, 3, 3))
        with torch.no_grad(), kernel_mode(mode):
            seqs[mode] = generate(target, ids, drafter=spy, max_new_tokens=10).sequences
        drafts[mode] = spy.drafts
    assert torch.equal(seqs["torch"], seqs["triton"])
    assert len(drafts["torch"]) == len(drafts["triton"]) > 0
    for a, b in zip(drafts["torch"], drafts["triton"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("quantize", ROUNDINGS)
@pytest.mark.parametrize("fast", [False, True])
def test_greedy_decoding_with_a_float8_head_is_lossless(target, fast, quantize):
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    plain = generate(target, ids, max_new_tokens=16)
    head = quantize(_head(target))
    spec = generate(target, ids, drafter=EagleDrafter(head, DynamicTree(12, 3, 3)), max_new_tokens=16, fast=fast)
    assert torch.equal(spec.sequences, plain.sequences)


@needs_interpreter
@pytest.mark.parametrize("quantize", ROUNDINGS)
@pytest.mark.parametrize("cls,recipe", [(DFlashHead, recipes.dflash), (DSparkHead, recipes.dspark)])
def test_block_drafters_round_their_layers_and_the_shared_lm_head_and_stay_lossless(target, cls, recipe, quantize):
    head = cls.from_target(target, block_size=4, num_layers=1, seed=3).float().eval().requires_grad_(False)
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    plain = generate(target, ids, max_new_tokens=8)
    quantize(head)
    assert isinstance(head.lm_head_fp8, _ROUNDED) and not any(type(m) is torch.nn.Linear for m in head.modules())
    h = torch.randn(3, head.config.hidden_size)
    torch.testing.assert_close(head.logits(h), head.lm_head_fp8(h))
    for mode in ("torch", "triton"):
        with kernel_mode(mode):
            out = generate(target, ids, drafter=recipe(head), max_new_tokens=8)
        assert torch.equal(out.sequences, plain.sequences) and sum(out.stats.depth_tries) > 0


@pytest.mark.parametrize("quantize", ROUNDINGS)
def test_a_peagle_head_rounds_every_linear_and_stays_lossless(target, quantize):
    head = PEagleHead.from_target(target, num_layers=1, max_drafts=4, feature_layers=(0, 1, 2)).float()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.05)
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    plain = generate(target, ids, max_new_tokens=8)
    quantize(head.eval().requires_grad_(False))
    assert not any(type(m) is torch.nn.Linear for m in head.modules())
    out = generate(target, ids, drafter=recipes.peagle(head), max_new_tokens=8)
    assert torch.equal(out.sequences, plain.sequences) and sum(out.stats.depth_tries) > 0


def test_a_head_with_nothing_to_round_is_refused_by_name(target):
    """A Medusa head's projections are stacked tensors, not nn.Linear: quantize_fp8_ says so instead of returning
    the head unchanged (a user would time a bfloat16 head believing it rounded); so does skipping every linear."""
    head = MedusaHead.from_target(target, num_heads=2).eval().requires_grad_(False)
    with pytest.raises(ValueError, match="MedusaHead has no nn.Linear left to round"):
        quantize_fp8_(head)
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4)).requires_grad_(False)
    with pytest.raises(ValueError, match="nothing would change"):
        quantize_fp8_(mlp, skip=("0",))
    assert type(mlp[0]) is torch.nn.Linear


@needs_cuda
@pytest.mark.parametrize("rows", [1, 7, 10, 16, 61, 100])
@pytest.mark.parametrize("n,k,bias", [(4096, 4096, False), (4096, 8192, True), (512, 1000, False)])
def test_on_the_gpu_the_kernels_equal_the_references_and_replay_in_a_graph(rows, n, k, bias):
    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w8, ws = quantize_fp8_rows((torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16))
    b = torch.randn(n, device="cuda", generator=g, dtype=torch.bfloat16) if bias else None
    q, s = quantize_fp8_rows(x)
    want_q, want_s = quantize_fp8_rows_ref(x)
    # equal values (the GPU compiler may write a tiny negative entry's zero as +0 where the reference keeps -0)
    assert torch.equal(q.float(), want_q.float()) and torch.equal(s, want_s)
    y = linear_fp8(x, w8, ws, b)
    torch.testing.assert_close(y.float(), linear_fp8_ref(x.float(), w8, ws, None if b is None else b.float()),
                               atol=2e-2, rtol=2e-2)
    assert_replay_equals_a_call(lambda: linear_fp8(x, w8, ws, b), x,
                                torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16))


@needs_cuda
@pytest.mark.parametrize("quantize", ROUNDINGS)
@pytest.mark.parametrize("fast", [False, True])
def test_on_the_gpu_a_float8_head_decodes_losslessly(fast, quantize):
    """float32 target (greedy identity is exact there), the head's linears on the float8 / 4-bit kernels."""
    target = tiny_model("llama", layers=2, scale=4.0).cuda()
    ids = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1)).cuda()
    plain = generate(target, ids, max_new_tokens=16)
    head = quantize(_head(target))
    spec = generate(target, ids, drafter=EagleDrafter(head, DynamicTree(12, 3, 3)), max_new_tokens=16, fast=fast)
    assert torch.equal(spec.sequences, plain.sequences) and sum(spec.stats.depth_tries) > 0


@needs_cuda
@pytest.mark.parametrize("quantize", ROUNDINGS)
@pytest.mark.parametrize("cls,recipe", [(DFlashHead, recipes.dflash), (DSparkHead, recipes.dspark)])
@pytest.mark.parametrize("fast", [False, True])
def test_on_the_gpu_block_drafters_with_a_float8_lm_head_decode_losslessly(cls, recipe, fast, quantize):
    """DFlash / DSpark rounded whole (their layers and the float8 copy of the target's lm_head, on the kernels):
    float32 target, greedy identity, eager and on the fast path."""
    target = tiny_model("llama", layers=2, scale=4.0).cuda()
    head = cls.from_target(target, block_size=4, num_layers=1, seed=3).float().eval().requires_grad_(False)
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4)).cuda()
    plain = generate(target, ids, max_new_tokens=12)
    quantize(head)
    assert isinstance(head.lm_head_fp8, _ROUNDED)
    out = generate(target, ids, drafter=recipe(head), max_new_tokens=12, fast=fast)
    assert torch.equal(out.sequences, plain.sequences) and sum(out.stats.depth_tries) > 0
