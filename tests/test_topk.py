"""topk_rows (the dynamic tree's per-level top-k) against its reference, a stable descending sort."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels import (
    TOPK_CHUNK,
    TOPK_MAX_N,
    interpreter_enabled,
    kernel_mode,
    log_softmax_topk,
    log_softmax_topk_ref,
    topk_rows,
    topk_rows_ref,
    triton_available,
)
from specdec.trees import grow_dynamic_tree, grow_dynamic_tree_ref

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES or not triton_available(), reason="needs triton on CUDA or interpreted")


def _rows(shape, seed, device, dtype=torch.float32, ties=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if ties:  # few distinct values: many ties, broken by ascending index
        x = (x * 2).round() / 2
    return x.to(device=device, dtype=dtype)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,k", [((10, 4096), 10), ((1, 4096), 10), ((3, 100), 10), ((2, 5, 37), 7),
                                     ((4, 1000), 32), ((6, 3), 3), ((3, 32000), 10), ((2, 8193), 32),
                                     ((1, 4097), 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_the_kernel_equals_a_stable_descending_sort(device, shape, k, ties):
    x = _rows(shape, seed=shape[-1] + k, device=device, ties=ties)
    with kernel_mode("triton"):
        values, indices = topk_rows(x, k)
    ref_values, ref_indices = topk_rows_ref(x, k)
    assert values.shape == indices.shape == (*shape[:-1], k) and indices.dtype == torch.long
    assert torch.equal(indices, ref_indices)
    assert torch.equal(values, ref_values) and torch.equal(values, x.gather(-1, indices))


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,k", [((10, 4096), 10), ((3, 100), 10), ((2, 5, 37), 7), ((6, 3), 3),
                                     ((3, 32000), 10), ((2, 8193), 32), ((1, 4097), 1)])
def test_log_softmax_topk_equals_log_softmax_then_a_stable_sort(device, shape, k):
    """One row in one program, and rows in chunks whose log-sum-exp is merged from their statistics (32k)."""
    x = _rows(shape, seed=shape[-1] + 2 * k, device=device) * 4
    with kernel_mode("triton"):
        values, indices = log_softmax_topk(x, k)
    ref_values, ref_indices = log_softmax_topk_ref(x, k)
    assert values.shape == (*shape[:-1], k) and values.dtype == torch.float32
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, atol=2e-5, rtol=1e-6)
    x[..., :1] = float("-inf")  # a masked token: never drawn, the rest unchanged
    with kernel_mode("triton"):
        values, indices = log_softmax_topk(x, k)
    torch.testing.assert_close(values, log_softmax_topk_ref(x, k)[0], atol=2e-5, rtol=1e-6)
    assert not (indices == 0).any() or k == shape[-1]


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_minus_infinity_comes_last_and_every_index_is_taken_once(device):
    """Rows with fewer finite entries than k (masked log-probs): -inf entries follow by ascending index, none twice."""
    x = torch.full((2, 9), float("-inf"), device=device)
    x[0, 4], x[0, 1], x[1, 7] = 0.5, 2.0, -1.0
    with kernel_mode("triton"):
        values, indices = topk_rows(x, 5)
    assert indices.tolist() == [[1, 4, 0, 2, 3], [7, 0, 1, 2, 3]]
    assert torch.equal(values, topk_rows_ref(x, 5)[0])


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(), reason="the GPU kernel")
def test_bf16_on_the_gpu_and_inside_torch_compile():
    x = _rows((10, 4096), seed=1, device="cuda", dtype=torch.bfloat16)
    values, indices = topk_rows(x, 10)
    assert values.dtype == torch.bfloat16 and torch.equal(indices, topk_rows_ref(x, 10)[1])
    lp, ids = log_softmax_topk(x, 10)  # bf16 logits, float32 log-probabilities
    ref_lp, ref_ids = log_softmax_topk_ref(x, 10)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(lp, ref_lp, atol=2e-5, rtol=1e-6)
    compiled_lp = torch.compile(lambda t: log_softmax_topk(t, 10), fullgraph=True)(x)
    assert torch.equal(compiled_lp[1], ref_ids)
    compiled = torch.compile(lambda t: topk_rows(torch.log_softmax(t.float(), -1), 10), fullgraph=True)
    cv, ci = compiled(x)
    rv, ri = topk_rows_ref(torch.log_softmax(x.float(), -1), 10)
    assert torch.equal(ci, ri)
    torch.testing.assert_close(cv, rv)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_many_chunks_merge_in_order(device):
    """Rows past one program's chunk (a 32k vocabulary): the chunks' best are merged, ties stay ascending across
    chunks, and -inf entries past the finite ones come by ascending index; three launches past TOPK_CHUNK ** 2."""
    x = torch.full((2, 3 * TOPK_CHUNK + 5), float("-inf"), device=device)
    x[0, [7, TOPK_CHUNK + 3, 2 * TOPK_CHUNK + 1, 3 * TOPK_CHUNK + 4]] = 1.0  # four equal maxima in four chunks
    x[1, 3 * TOPK_CHUNK + 2] = 0.0
    with kernel_mode("triton"):
        values, indices = topk_rows(x, 6)
    assert indices[0].tolist() == [7, TOPK_CHUNK + 3, 2 * TOPK_CHUNK + 1, 3 * TOPK_CHUNK + 4, 0, 1]
    assert indices[1].tolist() == [3 * TOPK_CHUNK + 2, 0, 1, 2, 3, 4]
    assert torch.equal(values, topk_rows_ref(x, 6)[0])


def test_long_rows_large_k_and_bad_inputs():
    x = torch.randn(2, 300)
    assert TOPK_MAX_N >= 32000 * 8  # every vocabulary in use runs the kernel
    assert torch.equal(topk_rows(x[:, :50], 40)[1], topk_rows_ref(x[:, :50], 40)[1])  # k past the kernel's reach
    with pytest.raises(ValueError, match="k must be between 1 and the row length"):
        topk_rows(x[:, :4], 5)
    with pytest.raises(ValueError, match="floating point"):
        topk_rows(torch.arange(6).view(2, 3), 2)


def _tree_inputs(device, seed, ties=False):
    """A root's logits, its hidden state and an ``expand`` whose children depend on the token and the level."""
    B, V, H = 2, 40, 8
    g = torch.Generator().manual_seed(seed)
    table, root = torch.randn(V, V, generator=g), torch.randn(B, V, generator=g)
    if ties:
        table, root = (table * 2).round() / 2, (root * 2).round() / 2
    table, root = table.to(device), root.to(device)

    def expand(tokens, hidden, visible, level):
        return table[tokens % V] + level * 0.5, hidden

    return root, torch.zeros(B, H, device=device), expand


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ties", [False, True])
def test_the_dynamic_tree_on_the_kernel_equals_it_on_the_reference(device, ties):
    """grow_dynamic_tree with every top-k on the kernel against the same code on the reference (coarse logits:
    ties); without ties, both against the per-row reference of the paper's steps."""
    root, hidden, expand = _tree_inputs(device, 5, ties)
    trees = []
    for mode in ("triton", "torch"):
        with kernel_mode(mode):
            trees.append(grow_dynamic_tree(root, hidden, expand, depth=4, top_k=3, total_tokens=12))
    if not ties:
        trees.append(grow_dynamic_tree_ref(root, hidden, expand, depth=4, top_k=3, total_tokens=12))
    for other in trees[1:]:
        assert torch.equal(trees[0].tokens, other.tokens) and torch.equal(trees[0].parents, other.parents)
        assert torch.equal(trees[0].depths, other.depths)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,k", [((10, 300), 10), ((3, 8192), 10), ((2, 5, 37), 7), ((1, 4097), 1)])
def test_an_index_map_is_read_by_the_last_launch(device, shape, k):
    """``index_map``: the ids come out as ``index_map[indices]`` (a draft vocabulary's target ids), from one launch
    or from the merge of chunks (8192: two launches), values unchanged; a map of the wrong length is refused."""
    x = _rows(shape, seed=shape[-1] + 3 * k, device=device) * 4
    index_map = torch.randperm(5 * shape[-1], generator=torch.Generator().manual_seed(1))[:shape[-1]].to(device)
    with kernel_mode("triton"):
        values, ids = log_softmax_topk(x, k, index_map=index_map)
        plain_values, indices = log_softmax_topk(x, k)
    ref_values, ref_ids = log_softmax_topk_ref(x, k, index_map=index_map)
    assert ids.dtype == torch.long and torch.equal(ids, index_map[indices]) and torch.equal(ids, ref_ids)
    assert torch.equal(values, plain_values)
    torch.testing.assert_close(values, ref_values, atol=2e-5, rtol=1e-6)
    with pytest.raises(ValueError, match="index_map must be an int32/int64 vector of the row length"):
        log_softmax_topk(x, k, index_map=index_map[:-1])


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_the_dynamic_tree_reads_a_vocab_map_inside_its_top_k(device):
    """A draft vocabulary as a :class:`VocabMap` (read by the top-k's launch) gives the tree a function map gives."""
    from specdec.trees import VocabMap

    root, hidden, expand = _tree_inputs(device, 6)
    ids = torch.randperm(3 * root.shape[1], generator=torch.Generator().manual_seed(7))[:root.shape[1]].to(device)
    trees = []
    for mode in ("triton", "torch"):
        with kernel_mode(mode):
            for to_target in (VocabMap(ids), lambda d: ids[d]):
                trees.append(grow_dynamic_tree(root, hidden, expand, depth=4, top_k=3, total_tokens=12,
                                               draft_to_target=to_target))
    trees.append(grow_dynamic_tree_ref(root, hidden, expand, depth=4, top_k=3, total_tokens=12,
                                       draft_to_target=VocabMap(ids)))
    assert bool(torch.isin(trees[0].tokens, ids).all())
    for other in trees[1:]:
        assert torch.equal(trees[0].tokens, other.tokens) and torch.equal(trees[0].parents, other.parents)
    with pytest.raises(ValueError, match="int64 vector"):
        VocabMap(ids.int())


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
def test_the_custom_op_traces_under_torch_compile(device):
    """torch.ops.specdec.topk_rows (what topk_rows calls on CUDA, also inside generate(fast="compile")): its fake
    gives the shapes dynamo and AOT autograd trace with, and the compiled function returns the kernel's result."""
    import torch._dynamo

    torch._dynamo.reset()
    x = _rows((3, 2, 50), seed=9, device=device)
    fn = torch.compile(lambda t: torch.ops.specdec.topk_rows(torch.log_softmax(t, -1), 5), backend="aot_eager",
                       fullgraph=True)
    values, indices = fn(x)
    ref_values, ref_indices = topk_rows_ref(torch.log_softmax(x, -1), 5)
    assert values.shape == (3, 2, 5) and torch.equal(indices, ref_indices)
    torch.testing.assert_close(values, ref_values)
    fused = torch.compile(lambda t: torch.ops.specdec.log_softmax_topk(t, 5), backend="aot_eager", fullgraph=True)
    lp, ids = fused(x)
    assert lp.dtype == torch.float32 and torch.equal(ids, ref_indices)
    torch.testing.assert_close(lp, ref_values, atol=2e-5, rtol=1e-6)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("chunk", [None, 64])
def test_packed_keys_and_the_two_reductions_pick_alike_at_every_edge(device, packed, chunk):
    """One pick per maximum over packed (value, index) keys (the default) and the older two reductions give the
    stable sort's answer: signed zeros equal (by ascending index), -inf entries ordinary values, denormals and
    float32 extremes ordered, ties across chunks (``chunk=64``: many merged chunks) and the log-softmax values."""
    from specdec.kernels.topk import _topk_rows_triton

    tiny = torch.finfo(torch.float32).tiny
    x = torch.tensor([[0.0, -0.0, -1.0, float("-inf"), -0.0, 0.0, 3.0, -2.0, tiny / 4, -tiny / 4, 3.4e38, -3.4e38]
                      * 20], device=device)
    x = torch.cat([x, x.flip(-1), torch.randn(1, 240, generator=torch.Generator().manual_seed(3)).to(device)])
    for k in (1, 7, 32):
        values, indices = _topk_rows_triton(x, k, packed=packed, chunk=chunk)
        ref_values, ref_indices = topk_rows_ref(x, k)
        assert torch.equal(indices, ref_indices), (k, indices, ref_indices)
        assert torch.equal(values, ref_values)
    values, indices = _topk_rows_triton(x[2:] * 5, 10, lse=True, packed=packed, chunk=chunk)
    ref_values, ref_indices = log_softmax_topk_ref(x[2:] * 5, 10)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, atol=2e-5, rtol=1e-6)
