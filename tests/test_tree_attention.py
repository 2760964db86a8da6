"""tree_attention: a few queries per row (tree nodes) over a static cache, split along the keys, against SDPA."""
from __future__ import annotations

import importlib
import sys

import pytest
import torch
from tiny_models import VOCAB, noisy_copy, tiny_model

from specdec import recipes
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.fused import FusedDecoder, decode_kernels
from specdec.generate import generate
from specdec.heads import Eagle1Head
from specdec.kernels import (
    TREE_ATTENTION_MAX_M,
    interpreter_enabled,
    kernel_mode,
    tree_attention,
    tree_attention_launch,
    tree_attention_plan,
    tree_attention_ref,
    tree_attention_split,
    triton_available,
)
from specdec.kernels.tree_attention import _tree_attention_triton
from specdec.nn import masked_attention, use_tree_attention
from specdec.static import slot_cache

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES or not triton_available(), reason="needs triton on CUDA or interpreted")
MIN = torch.finfo(torch.float32).min


def _case(B, H, Hkv, M, S, d, seed=0, device="cpu", dtype=torch.float32, hidden=MIN):
    """Queries as a strided view (as the decoder's), a cache, and a tree mask: row b hides a prefix of b slots
    (left padding) and the free slots past S - M; node m sees the committed slots, itself and random earlier nodes."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, M, H + 1, d, generator=g)[:, :, :H].transpose(1, 2)
    k, v = torch.randn(B, Hkv, S, d, generator=g), torch.randn(B, Hkv, S, d, generator=g)
    committed = S - M - 7
    seen = torch.zeros(B, M, S, dtype=torch.bool)
    seen[:, :, :committed] = True
    for b in range(B):
        seen[b, :, :b] = False
    tree = torch.rand(B, M, M, generator=g) < 0.3
    seen[:, :, committed:committed + M] = tree.tril(-1) | torch.eye(M, dtype=torch.bool)
    mask = torch.where(seen, 0.0, hidden)[:, None]
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, mask)]


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,H,Hkv,M,S,d,block", [(1, 5, 5, 61, 300, 64, None), (2, 8, 2, 10, 100, 32, 32),
                                                 (1, 4, 1, 2, 64, 16, None), (2, 2, 2, 100, 260, 64, 64),
                                                 (1, 3, 3, 7, 45, 24, None), (1, 2, 2, 9, 300, 16, 96),
                                                 (1, 32, 32, 60, 200, 16, None), (2, 16, 4, 50, 130, 32, None)])
def test_the_kernel_equals_sdpa(device, B, H, Hkv, M, S, d, block):
    q, k, v, mask = _case(B, H, Hkv, M, S, d, seed=S + M, device=device)
    out = _tree_attention_triton(q, k, v, mask, 0.3, block)
    assert out.shape == (B, H, M, d) and out.dtype == q.dtype
    torch.testing.assert_close(out, tree_attention_ref(q, k, v, mask, 0.3), atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_chunks_hidden_whole_by_minus_infinity_and_a_shared_mask_are_handled(device):
    q, k, v, mask = _case(1, 4, 2, 6, 96, 16, device=device, hidden=float("-inf"))
    q, k, v = (t.expand(2, *t.shape[1:]) for t in (q, k, v))
    mask[..., :40] = float("-inf")  # the first chunks of 32 keys hidden whole (m = -inf there)
    out = _tree_attention_triton(q, k, v, mask, None, 32)
    torch.testing.assert_close(out, tree_attention_ref(q, k, v, mask), atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m,splits,tile", [(16, 1, None), (32, 1, None), (16, 3, 128), (64, 2, None),
                                                 (None, None, None)])
def test_keys_past_kv_end_are_hidden_and_not_read(device, block_m, splits, tile):
    """Every plan (one launch, or split keys and a merge) with a per-row end: the keys past it hold NaN, which a
    kernel that read them would return. The result equals the reference under the same bound."""
    q, k, v, mask = _case(2, 4, 2, 12, 320, 16, seed=5, device=device)
    kv_end = torch.tensor([150, 97], device=device)  # the rows' committed keys and tree end below these
    mask[0, ..., 120:150] = 0.0
    mask[1, ..., 60:97] = 0.0
    k_nan, v_nan = k.clone(), v.clone()
    for b, end in enumerate(kv_end.tolist()):
        k_nan[b, :, end:] = float("nan")
        v_nan[b, :, end:] = float("nan")
    out = _tree_attention_triton(q, k_nan, v_nan, mask, None, kv_end=kv_end, block_m=block_m, num_splits=splits,
                                 tile_s=tile)  # 128-key tiles: a chunk's keys in one or two tiles
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, tree_attention_ref(q, k, v, mask, kv_end=kv_end), atol=2e-5, rtol=1e-4)
    one = torch.tensor([97], device=device, dtype=torch.int32)  # one bound for every row
    torch.testing.assert_close(tree_attention(q, k, v, mask, kv_end=one) if device == "cuda" else
                               _tree_attention_triton(q, k, v, mask, None, kv_end=one, block_m=block_m,
                                                      num_splits=splits),
                               tree_attention_ref(q, k, v, mask, kv_end=one), atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m,splits,tile", [(16, 1, None), (32, 3, 32), (64, 2, None), (None, None, None)])
def test_a_shared_prefix_reads_query_zeros_mask_row(device, block_m, splits, tile):
    """prefix_end: the keys below it take query 0's mask row for every query, in the kernels (whatever the plan,
    chunks straddling the bound included) as in the reference; where the queries share that row (a verify's
    committed slots) the result is the plain one, and a query that differs there (padding) sees query 0's row."""
    q, k, v, mask = _case(2, 4, 2, 12, 320, 16, seed=11, device=device)
    kv_end = torch.tensor([300, 250], device=device)
    prefix_end = torch.tensor([281, 231], device=device)  # the committed slots; the last 19 keys are the tree's
    hidden = mask.min()
    for b, p in enumerate(prefix_end.tolist()):
        mask[b, 0, :, :p] = mask[b, 0, 0, :p]  # every query sees the committed slots as query 0 does
        mask[b, 0, :, 5:9] = hidden  # holes in the committed slots (rejected drafts)
    padded = mask.clone()
    for b, p in enumerate(prefix_end.tolist()):
        padded[b, 0, -2:, :p] = hidden  # two padding queries hidden from the committed slots
    out = _tree_attention_triton(q, k, v, padded, None, kv_end=kv_end, prefix_end=prefix_end, block_m=block_m,
                                 num_splits=splits, tile_s=tile)
    want = tree_attention_ref(q, k, v, mask, kv_end=kv_end)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tree_attention_ref(q, k, v, padded, kv_end=kv_end, prefix_end=prefix_end), want,
                               atol=2e-5, rtol=1e-4)
    assert not torch.allclose(tree_attention_ref(q, k, v, padded, kv_end=kv_end)[:, :, -2:], want[:, :, -2:])
    one = torch.tensor([200], device=device, dtype=torch.int32)  # one bound for every row, below both trees
    torch.testing.assert_close(_tree_attention_triton(q, k, v, mask, None, kv_end=kv_end, prefix_end=one,
                                                      block_m=block_m, num_splits=splits, tile_s=tile),
                               want, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="prefix_end must be an integer tensor"):
        tree_attention(q, k, v, mask, prefix_end=torch.tensor([1.0]))


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_m,splits,tile", [(16, 1, None), (32, 3, 32), (64, 2, 32), (None, None, None)])
def test_a_visible_prefix_reads_no_mask(device, block_m, splits, tile):
    """visible_end: the keys below it are seen by every query whatever the mask says there (the kernels read no
    mask for them), in the kernels as in the reference; where the mask already shows them (a dense row's committed
    slots) the result is the plain one. kv_start: the keys below it hidden and not read (a left-padded row)."""
    q, k, v, mask = _case(2, 4, 2, 12, 320, 16, seed=12, device=device)
    kv_end = torch.tensor([300, 250], device=device)
    visible = torch.tensor([281, 231], device=device)  # the committed slots; the last 19 keys are the tree's
    dense = mask.clone()
    for b, p in enumerate(visible.tolist()):
        dense[b, 0, :, :p] = 0.0  # every query sees every committed slot
    holes = dense.clone()
    holes[:, 0, :, 5:9] = mask.min()  # what the bound overrides: the kernels read no mask below it
    want = tree_attention_ref(q, k, v, dense, kv_end=kv_end)
    for m in (dense, holes):
        out = _tree_attention_triton(q, k, v, m, None, kv_end=kv_end, visible_end=visible, block_m=block_m,
                                     num_splits=splits, tile_s=tile)
        torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(tree_attention_ref(q, k, v, m, kv_end=kv_end, visible_end=visible), want,
                                   atol=2e-5, rtol=1e-4)
    assert not torch.allclose(tree_attention_ref(q, k, v, holes, kv_end=kv_end), want)
    one = torch.tensor([3], device=device, dtype=torch.int32)  # one bound for every row, below the holes
    torch.testing.assert_close(_tree_attention_triton(q, k, v, holes, None, kv_end=kv_end, visible_end=one,
                                                      block_m=block_m, num_splits=splits, tile_s=tile),
                               tree_attention_ref(q, k, v, holes, kv_end=kv_end), atol=2e-5, rtol=1e-4)
    # a left-padded row: its first slots hidden for every query, not read (kv_start), the rest up to its end seen
    start = torch.tensor([0, 37], device=device)
    padded = dense.clone()
    padded[1, 0, :, :37] = mask.min()
    want = tree_attention_ref(q, k, v, padded, kv_end=kv_end)
    out = _tree_attention_triton(q, k, v, holes, None, kv_end=kv_end, visible_end=visible, kv_start=start,
                                 block_m=block_m, num_splits=splits, tile_s=tile)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(tree_attention_ref(q, k, v, holes, kv_end=kv_end, visible_end=visible, kv_start=start),
                               want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(_tree_attention_triton(q, k, v, dense, None, kv_end=kv_end, kv_start=start,
                                                      block_m=block_m, num_splits=splits, tile_s=tile),
                               want, atol=2e-5, rtol=1e-4)  # hidden below the start though the mask shows them
    with pytest.raises(ValueError, match="not both"):
        tree_attention(q, k, v, mask, prefix_end=visible, visible_end=visible)
    with pytest.raises(ValueError, match="visible_end must be an integer tensor"):
        tree_attention(q, k, v, mask, visible_end=torch.tensor([1.0]))


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_a_shared_mask_with_a_bound_per_row(device):
    """One mask for every row (``[1, 1, M, S]``) and a different end per row: the reference expands the mask."""
    q, k, v, mask = _case(3, 2, 2, 5, 96, 16, seed=7, device=device)
    mask = mask[:1]
    kv_end = torch.tensor([96, 70, 40], device=device)
    mask[..., :30] = 0.0  # every row sees its first 30 slots at least
    out = _tree_attention_triton(q, k, v, mask, None, kv_end=kv_end)
    ref = tree_attention_ref(q, k, v, mask, kv_end=kv_end)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(ref[2], tree_attention_ref(q, k, v, mask)[2])  # the bound changed row 2's result


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bounds", ["none", "kv_end", "prefix", "visible"])
def test_the_merge_inside_the_split_kernel_equals_the_merge_launch(device, bounds, monkeypatch):
    """fused_merge: the last program of each block of queries merges the chunks (an atomic counter per block, left
    at zero): the reference's result and the two-launch merge's, with chunks hidden whole by -inf, NaN keys past
    the rows' ends, a shared or a visible prefix; no merge launch; repeated (on CUDA a race would show)."""
    ta = importlib.import_module("specdec.kernels.tree_attention")  # the package's name is the function

    q, k, v, mask = _case(2, 2, 1, 21, 160, 16, seed=21, device=device, hidden=float("-inf"))
    mask[1, ..., :50] = float("-inf")  # row 1's first chunks hidden whole: m = -inf, no partial sums
    kv_end = torch.tensor([150, 120], device=device)
    if bounds != "none":  # keys past the ends: NaN, which a kernel that read them would return
        k[0, :, 150:], v[1, :, 120:] = float("nan"), float("nan")
    kw = {"none": {}, "kv_end": dict(kv_end=kv_end), "prefix": dict(kv_end=kv_end, prefix_end=kv_end - 25),
          "visible": dict(kv_end=kv_end, visible_end=torch.tensor([0, 0], device=device))}[bounds]
    want = tree_attention_ref(q, k.nan_to_num(), v.nan_to_num(), mask, **kw)
    merges = []
    launch = ta._tree_merge_kernel
    monkeypatch.setattr(ta, "_tree_merge_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: merges.append(grid) or launch[grid]})())
    for splits, block_m in [(2, 16), (3, 32), (5, 16)]:
        two = _tree_attention_triton(q, k, v, mask, None, num_splits=splits, block_m=block_m, fused_merge=False,
                                     **kw)
        assert len(merges) == 1
        for _ in range(20 if device == "cuda" else 1):
            one = _tree_attention_triton(q, k, v, mask, None, num_splits=splits, block_m=block_m, fused_merge=True,
                                         **kw)
            torch.testing.assert_close(one, two, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(one, want, atol=2e-5, rtol=1e-4)
        assert len(merges) == 1 and not ta._COUNTERS[(q.device.type, q.device.index)].any()
        merges.clear()
    ta.use_fused_tree_merge(True)  # the module's switch: the default of every later call
    try:
        torch.testing.assert_close(_tree_attention_triton(q, k, v, mask, None, num_splits=3, **kw), want,
                                   atol=2e-5, rtol=1e-4)
        assert not merges
    finally:
        ta.use_fused_tree_merge(False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="needs a CUDA GPU")
def test_the_fused_merge_replays_in_a_cuda_graph_and_is_not_allocated_during_a_capture():
    from specdec.graphs import capture_graph

    ta = importlib.import_module("specdec.kernels.tree_attention")

    q, k, v, mask = _case(1, 32, 32, 61, 600, 128, seed=3, device="cuda", dtype=torch.bfloat16)
    want = tree_attention_ref(q.float(), k.float(), v.float(), mask.float())
    step = capture_graph(lambda *t: _tree_attention_triton(*t, None, num_splits=2, block_m=32, fused_merge=True),
                         (q, k, v, mask))
    for _ in range(10):
        torch.testing.assert_close(step(q, k, v, mask).float(), want, atol=2e-2, rtol=2e-2)
    assert not ta._COUNTERS[("cuda", q.device.index)].any()
    ta._COUNTERS.clear()  # no counters held: a capture does not allocate them, it merges in a second launch
    step = capture_graph(lambda *t: _tree_attention_triton(*t, None, num_splits=2, block_m=32, fused_merge=True),
                         (q, k, v, mask), warmup=0)
    assert ("cuda", q.device.index) not in ta._COUNTERS
    torch.testing.assert_close(step(q, k, v, mask).float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("bad", [torch.tensor([3.0]), torch.tensor([[3]]), torch.tensor([3, 4, 5])])
def test_a_bad_kv_end_is_named(bad):
    q, k, v, mask = _case(2, 2, 2, 4, 40, 8)
    with pytest.raises(ValueError, match="kv_end"):
        tree_attention(q, k, v, mask, kv_end=bad)


def test_the_plan_fills_the_gpu_with_query_blocks_or_splits_the_keys():
    assert tree_attention_plan(32 * 16, 61, 1216) == (64, 1)  # Llama-2-7B's verify forward, 16 rows: one launch
    assert tree_attention_plan(32 * 4, 61, 1216) == (32, 1)  # 4 rows: one launch, 32 queries per program
    assert tree_attention_plan(32, 60, 1216) == (32, 2)  # one row: blocks of 32 queries, two chunks of keys
    block_m, splits = tree_attention_plan(5, 64, 512)  # the fixture's 5 heads: 32 queries per program, split keys
    assert block_m == 32 and splits == 8
    block_m, splits = tree_attention_plan(32, 10, 1200)  # an EAGLE head's level: 32 programs, split keys
    assert block_m == 16 and splits == min(8, -(-1200 // tree_attention_split(32, 1200))) > 1
    assert tree_attention_launch(32, 10, 1200, 128)[2:] == (128, 8, 1)  # wide heads: 128-key tiles, 8 warps
    assert tree_attention_launch(5, 64, 512, 64)[2:] == (64, 4, 1)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_a_query_that_sees_no_key_gets_zeros(device):
    """A verify bucket's padding rows may see nothing: zeros (finite), the other queries unchanged."""
    q, k, v, mask = _case(1, 2, 2, 8, 96, 16, seed=6, device=device, hidden=float("-inf"))
    mask[:, :, 5:] = float("-inf")
    out = _tree_attention_triton(q, k, v, mask, None, 32)
    assert torch.equal(out[:, :, 5:], torch.zeros_like(out[:, :, 5:]))
    torch.testing.assert_close(out[:, :, :5], tree_attention_ref(q, k, v, mask)[:, :, :5], atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_bf16_stays_close_to_sdpa_in_float32(device):
    """bf16 inputs (on CPU the interpreter, whose dot misreads bf16, multiplies in float32): within bf16 rounding of
    the float32 result."""
    q, k, v, mask = _case(2, 4, 2, 20, 130, 32, seed=3, device=device)
    out = _tree_attention_triton(*(t.bfloat16() for t in (q, k, v, mask)), None)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), tree_attention_ref(q, k, v, mask), atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="bf16 on the GPU")
def test_bf16_on_the_gpu_stays_close_to_sdpa_and_runs_inside_torch_compile():
    q, k, v, mask = _case(1, 32, 32, 64, 1216, 128, device="cuda", dtype=torch.bfloat16)
    out = tree_attention(q, k, v, mask)
    torch.testing.assert_close(out.float(), tree_attention_ref(q, k, v, mask).float(), atol=2e-2, rtol=2e-2)
    compiled = torch.compile(lambda *t: tree_attention(*t) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), out * 2)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_the_custom_op_traces_under_torch_compile(device):
    """torch.ops.specdec.tree_attention (what tree_attention calls on CUDA, also in generate(fast="compile")): its
    fake gives dynamo and AOT autograd the output's shape, and the compiled function returns the kernel's result."""
    import torch._dynamo

    torch._dynamo.reset()
    q, k, v, mask = _case(2, 4, 2, 9, 70, 16, device=device)
    fn = torch.compile(lambda *t: torch.ops.specdec.tree_attention(*t, None) + 1, backend="aot_eager",
                       fullgraph=True)
    torch.testing.assert_close(fn(q, k, v, mask), tree_attention_ref(q, k, v, mask) + 1, atol=2e-5, rtol=1e-4)
    end = torch.tensor([50, 70], device=device)
    fn = torch.compile(lambda *t: torch.ops.specdec.tree_attention(*t, None, end) + 1, backend="aot_eager",
                       fullgraph=True)
    torch.testing.assert_close(fn(q, k, v, mask), tree_attention_ref(q, k, v, mask, kv_end=end) + 1, atol=2e-5,
                               rtol=1e-4)


def test_bad_inputs_are_named_long_forwards_run_the_reference_and_the_split_is_bounded():
    q, k, v, mask = _case(2, 4, 2, 5, 20, 8)
    with pytest.raises(ValueError, match=r"multiple of key/value heads"):
        tree_attention(q[:, :3], k, v, mask)
    with pytest.raises(ValueError, match=r"mask must be additive with shape \[B, 1, M, S\]"):
        tree_attention(q, k, v, mask[..., :10])
    with pytest.raises(ValueError, match=r"float \(additive\) mask"):
        tree_attention(q, k, v, mask == 0)
    with pytest.raises(ValueError, match=r"one shape"):
        tree_attention(q, k, v[:, :, :10], mask)
    with pytest.raises(ValueError, match=r"q must have shape \[B, H, M, d\]"):
        tree_attention(q[0], k, v, mask)
    q.requires_grad_(True)
    with kernel_mode("triton"):  # a gradient is needed: the reference (the kernels have no backward)
        tree_attention(q, k, v, mask).sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    long = _case(1, 2, 2, TREE_ATTENTION_MAX_M + 1, TREE_ATTENTION_MAX_M + 20, 8)
    with kernel_mode("triton"):  # past the kernel's reach even when forced: the reference
        torch.testing.assert_close(tree_attention(*long), tree_attention_ref(*long))
    for programs, keys in ((1, 10), (5, 512), (32, 1216), (4096, 8192), (7, 100_000)):
        block = tree_attention_split(programs, keys)
        chunks = -(-keys // block)
        assert block >= 32 and block % 32 == 0 and chunks <= -(-keys // 32)
        assert chunks * programs >= min(256, programs * -(-keys // 32)) // 2  # enough programs to fill a GPU


def _decoder_case(device, batch, M):
    model = tiny_model("llama").to(device)  # grouped-query attention (4 query heads, 2 key/value heads)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    S, T = 48, 20
    shapes = [((batch, config.num_key_value_heads, S, head_dim), torch.float32)] * config.num_hidden_layers
    g = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, VOCAB, (batch, T), generator=g).to(device)
    tokens = torch.randint(0, VOCAB, (batch, M), generator=g).to(device)
    seen = torch.zeros(batch, 1, M, S, dtype=torch.bool)
    seen[..., :T] = True
    seen[..., T:T + M] = torch.eye(M, dtype=torch.bool) | torch.ones(M, M, dtype=torch.bool).tril(-1)
    mask = torch.where(seen, 0.0, MIN).to(device)
    positions = (T + torch.arange(M, device=device)).expand(batch, M)
    return model, shapes, prefix, tokens, mask, positions, T + torch.arange(M, device=device)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_fused_decoder_verifies_a_tree_with_the_kernel_as_with_sdpa(batch, device):
    model, shapes, prefix, tokens, mask, positions, slots = _decoder_case(device, batch, M=6)
    outs = []
    for tree, mode in ((False, "auto"), (True, "triton")):
        with decode_kernels(tree_attention=tree, gemv_rows=0, fused_ops=False):
            dec = FusedDecoder(model, max_positions=64)
        assert dec.tree_attention is tree and dec.settings["tree_attention"] is tree
        cache = slot_cache(shapes, torch.device(device))
        dec.prefill(prefix, torch.ones_like(prefix, dtype=torch.bool), cache.layers, all_valid=True)
        with kernel_mode(mode):
            outs.append(dec(tokens, positions, mask, slots, cache.layers, (1,)))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(outs[1][1][0], outs[0][1][0], atol=2e-5, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_masked_attention_takes_the_kernel_when_asked_and_only_then(device, monkeypatch):
    """use_tree_attention(True) routes masked_attention of 2..128 queries under a mask to the kernel (on CUDA; on
    CPU nothing changes, as SDPA runs there); decode_kernels(tree_attention=) sets it and restores it."""
    ta = sys.modules["specdec.nn.attention"]  # where masked_attention finds the kernel's entry point
    calls = []
    real = ta.tree_attention
    monkeypatch.setattr(ta, "tree_attention", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    q, k, v, mask = _case(1, 4, 2, 6, 40, 16, device=device)
    boolean = mask == 0
    assert use_tree_attention(True) is True  # the default
    with decode_kernels(tree_attention=False):
        assert use_tree_attention(False) is False
        sdpa = masked_attention(q, k, v, boolean)
    assert calls == []
    assert use_tree_attention(True) is True  # restored on leaving the block
    torch.testing.assert_close(masked_attention(q, k, v, boolean), sdpa, atol=2e-5, rtol=1e-4)
    assert calls == ([q.shape] if device == "cuda" else [])


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_tree_verification_on_the_fast_path_with_the_kernel_decodes_as_eager_greedy_decoding(device):
    """float32 greedy: generate(fast=True) verifying a draft model's trees with the kernel (forced and interpreted on
    CPU; on CUDA inside the captured steps, with EAGLE-2's head levels on it too) gives the eager tokens, with
    drafts accepted (the verify forward's every node matters)."""
    model = tiny_model("llama", scale=3.0).to(device)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(2)).to(device)
    drafters = {"draft_model_tree": lambda: DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3,
                                                             tree=[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])}
    if device == "cuda":
        torch.manual_seed(3)
        head = Eagle1Head.from_target(model).float().to(device)
        drafters["eagle2"] = lambda: recipes.eagle2(head, total_tokens=8, depth=2, top_k=3)
    taus = {}
    for name, make in drafters.items():
        eager = generate(model, ids, drafter=make(), max_new_tokens=8, eos_token_id=[])
        with kernel_mode("triton" if device == "cpu" else "auto"), decode_kernels(tree_attention=True):
            fast = generate(model, ids, drafter=make(), max_new_tokens=8, eos_token_id=[], fast=True)
        assert torch.equal(fast.sequences, eager.sequences), name
        assert fast.stats.num_target_forwards == eager.stats.num_target_forwards, name
        taus[name] = fast.stats.tau
    assert taus["draft_model_tree"] > 1.5  # drafts are accepted: every node's verification counts
