"""Tests of specdec.kernels: tree-mask fill, KV compaction, parallel-drafting inputs, dispatch, and the ops wired
into generate().

Each kernel is compared with its torch reference over awkward shapes (batch 1 and odd sizes, trees of 1 to 64
nodes, absent nodes, rows with nothing to keep): integers and copied floats must be identical. Without a GPU the
kernels run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1); with one, natively.
The references themselves are checked against the code they replace (ModelAdapter.forward's mask,
ModelAdapter.commit).
"""
from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_models import tiny_model

import specdec as sd
from specdec.adapter import CacheState, ModelAdapter
from specdec.kernels import (
    KVCompactPlan,
    _dispatch,
    accepted_feedback,
    accepted_feedback_ref,
    compact_kv,
    compact_kv_ref,
    emitted_tokens,
    emitted_tokens_ref,
    head_tree_mask,
    head_tree_mask_ref,
    head_update_mask,
    head_update_mask_ref,
    interpreter_enabled,
    kernel_mode,
    parallel_draft_inputs,
    parallel_draft_inputs_ref,
    tree_mask,
    tree_mask_ref,
    triton_available,
)
from specdec.masks import to_aligned_additive_mask
from specdec.trees import ancestor_matrix

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    not triton_available() or (DEVICE == "cpu" and not interpreter_enabled()),
    reason="needs triton (and, without a GPU, TRITON_INTERPRET=1 before specdec.kernels is imported)",
)
ROOT = Path(__file__).resolve().parents[1]


def kernel(fn, *args, **kwargs):
    """Run ``fn`` with the Triton kernels forced (natively on CUDA, interpreted on CPU)."""
    with kernel_mode("triton"):
        return fn(*args, **kwargs)


def reference(fn, *args, **kwargs):
    with kernel_mode("torch"):
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Tree-attention mask fill
# ----------------------------------------------------------------------------------------------------------------


def pending_forest(seed: int, batch: int, earlier: int, new: int, p_absent: float = 0.25):
    """Parents ``[B, P + M]`` of a pending forest and ``present [B, M]``: nodes on the committed prefix (-1, present),
    absent nodes (-1, not present) and children of earlier present nodes, different in every row."""
    rng = random.Random(seed)
    parents = torch.full((batch, earlier + new), -1, dtype=torch.long)
    present = torch.zeros(batch, earlier + new, dtype=torch.bool)
    for b in range(batch):
        alive = []
        for i in range(earlier + new):
            roll = rng.random()
            if roll < p_absent:
                continue
            present[b, i] = True
            if alive and roll > p_absent + 0.15:
                parents[b, i] = rng.choice(alive)
            alive.append(i)
    return parents, present[:, earlier:]


def assert_same_mask(got, want):
    assert got.mask.dtype == want.mask.dtype and got.mask.shape == want.mask.shape
    assert got.mask.stride() == want.mask.stride()
    assert torch.equal(got.mask, want.mask)
    # the alignment padding of the storage holds the same values too
    full = lambda m: torch.as_strided(m, (*m.shape[:-1], m.stride(-2)), m.stride())  # noqa: E731
    assert torch.equal(full(got.mask), full(want.mask))
    assert (got.positions is None) == (want.positions is None)
    if want.positions is not None:
        assert torch.equal(got.positions, want.positions)


# (batch, committed slots Lc, earlier pending P, new nodes M, dtype): trees of 1 to 64 nodes, empty prefix, long
# prefix (several tiles), pending slots from earlier forwards, batch 1 and odd sizes.
MASK_CASES = [
    (1, 0, 0, 1, torch.float32),
    (1, 5, 0, 64, torch.bfloat16),
    (3, 13, 0, 16, torch.float16),
    (3, 37, 5, 9, torch.float32),
    (8, 6, 2, 7, torch.bfloat16),
    (1, 1029, 0, 61, torch.float32),
    (3, 4, 3, 1, torch.float64),
]


@needs_kernels
@pytest.mark.parametrize("batch,prefix,earlier,new,dtype", MASK_CASES,
                         ids=[f"B{b}-Lc{lc}-P{p}-M{m}-{str(d)[6:]}" for b, lc, p, m, d in MASK_CASES])
def test_tree_mask_kernel_equals_reference(batch, prefix, earlier, new, dtype):
    g = torch.Generator().manual_seed(prefix + new)
    valid = (torch.rand(batch, prefix, generator=g) < 0.8).to(DEVICE)
    parents, present = pending_forest(prefix * 7 + new, batch, earlier, new)
    parents, present = parents.to(DEVICE), present.to(DEVICE)
    lengths = torch.randint(0, 500, (batch,), generator=g).to(DEVICE)
    want = tree_mask_ref(valid, parents, present, dtype, lengths=lengths)
    assert_same_mask(kernel(tree_mask, valid, parents, present, dtype, lengths=lengths), want)
    without_positions = kernel(tree_mask, valid, parents, present, dtype)
    assert without_positions.positions is None and torch.equal(without_positions.mask, want.mask)


@needs_kernels
def test_tree_mask_kernel_writes_into_a_preallocated_buffer_view():
    batch, prefix, earlier, new = 3, 11, 2, 6
    parents, present = pending_forest(5, batch, earlier, new)
    valid = torch.rand(batch, prefix, generator=torch.Generator().manual_seed(5)) < 0.7
    parents, present, valid = parents.to(DEVICE), present.to(DEVICE), valid.to(DEVICE)
    keys = prefix + earlier + new
    buffer = torch.full((4, 1, 10, 32), 7.0, device=DEVICE)  # bigger than needed, row stride 32
    out = buffer[:batch, :, :new, :keys]
    got = kernel(tree_mask, valid, parents, present, torch.float32, out=out)
    assert got.mask.data_ptr() == buffer.data_ptr()
    assert torch.equal(got.mask, tree_mask_ref(valid, parents, present, torch.float32).mask)
    untouched = torch.ones_like(buffer, dtype=torch.bool)
    untouched[:batch, :, :new, :keys] = False
    assert bool((buffer[untouched] == 7.0).all())


def test_tree_mask_reference_is_what_the_adapter_builds():
    # The reference must be a drop-in for ModelAdapter.forward's mask: capture the mask the adapter passes to the
    # model over a pending forest grown by two forwards (absent nodes included), and compare.
    model = tiny_model("llama")
    adapter = ModelAdapter(model)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(0))
    attention = torch.ones(2, 6, dtype=torch.long)
    attention[1, :2] = 0
    _, state = adapter.prefill(ids, attention)
    captured = []
    run = adapter._run
    adapter._run = lambda tokens, mask, positions, cache, **kw: (
        captured.append(mask), run(tokens, mask, positions, cache, **kw))[1]
    first = (torch.tensor([[11, 12, 13], [14, 15, 16]]), torch.tensor([[-1, 0, -1], [-1, -1, 0]]),
             torch.tensor([[True, True, False], [True, True, True]]))
    second = (torch.tensor([[21, 22], [23, 24]]), torch.tensor([[1, 3], [2, 3]]), torch.tensor([[True, True]] * 2))
    for tokens, parents, present in (first, second):
        all_parents = torch.cat([state.pending_parents, parents], 1)
        want = tree_mask_ref(state.committed_valid, all_parents, present, model.dtype, lengths=state.lengths)
        # What ModelAdapter.forward built before the kernel was wired in: ancestor matrix + prefix, aligned.
        anc = ancestor_matrix(all_parents)[:, -present.shape[1]:]
        prefix = state.committed_valid[:, None, :] & present[:, :, None]
        before = to_aligned_additive_mask(torch.cat([prefix, anc], 2)[:, None], model.dtype)
        _, state = adapter.forward(state, tokens, parents, want.positions, present)
        assert torch.equal(captured[-1], want.mask) and captured[-1].stride() == want.mask.stride()
        assert torch.equal(want.mask, before) and want.mask.stride() == before.stride()
    # positions = committed length + depth in the pending forest
    assert want.positions.tolist() == [[6 + 2, 6 + 3], [4 + 2, 4 + 3]]


def test_tree_mask_semantics_on_a_small_forest():
    # prefix slot 1 invalid; node 0 on the prefix, node 1 its child, node 2 absent, node 3 child of node 1
    valid = torch.tensor([[True, False, True]])
    parents = torch.tensor([[-1, 0, -1, 1]])
    present = torch.tensor([[True, True, False, True]])
    got = tree_mask(valid, parents, present, torch.float16, lengths=torch.tensor([2]))
    seen = (got.mask[0, 0] == 0).int().tolist()
    assert seen == [[1, 0, 1, 1, 0, 0, 0], [1, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1, 0], [1, 0, 1, 1, 1, 0, 1]]
    assert bool((got.mask[0, 0][got.mask[0, 0] != 0] == torch.finfo(torch.float16).min).all())
    assert got.positions.tolist() == [[2, 3, 2, 4]]
    assert got.mask.stride(-2) % 8 == 0


def test_tree_mask_rejects_bad_input_with_a_fix():
    valid, parents, present = torch.ones(2, 3, dtype=torch.bool), torch.full((2, 4), -1), torch.ones(2, 4).bool()
    with pytest.raises(ValueError, match="floating dtype"):
        tree_mask(valid, parents, present, torch.int32)
    with pytest.raises(ValueError, match=r"present covers the M new nodes"):
        tree_mask(valid, parents, torch.ones(2, 5).bool(), torch.float32)
    with pytest.raises(ValueError, match="preallocated buffer"):
        tree_mask(valid, parents, present, torch.float32, out=torch.empty(2, 1, 4, 6))


# (batch, capacity C, mask width W, first write slot Lc, new nodes M, dtype): Lc = 0, a long committed prefix
# (several tiles), the nodes' columns at the end of the width, batch 1 and odd sizes.
AT_CASES = [
    (1, 8, 8, 0, 1, torch.float32),
    (1, 96, 96, 5, 64, torch.bfloat16),
    (3, 70, 64, 13, 16, torch.float16),
    (2, 1200, 1152, 1029, 61, torch.float32),
    (4, 40, 40, 31, 9, torch.bfloat16),
]


@needs_kernels
@pytest.mark.parametrize("batch,capacity,width,start,new,dtype", AT_CASES,
                         ids=[f"B{b}-C{c}-W{w}-Lc{lc}-M{m}-{str(d)[6:]}" for b, c, w, lc, m, d in AT_CASES])
def test_tree_mask_at_kernel_equals_reference_and_tree_mask(batch, capacity, width, start, new, dtype):
    g = torch.Generator().manual_seed(start + new)
    valid = (torch.rand(batch, capacity, generator=g) < 0.8).to(DEVICE)
    parents, present = pending_forest(start * 3 + new, batch, 0, new)
    parents, present = parents.to(DEVICE), present.to(DEVICE)
    first = torch.tensor([start], device=DEVICE)
    want = sd.kernels.tree_mask_at_ref(valid, parents, present, first, torch.full((batch, 1, new, width), 7.0,
                                                                                  dtype=dtype, device=DEVICE))
    # written whole into a view of a bigger buffer (every column, no other element touched)
    buffer = torch.full((batch + 1, 1, new + 2, width + 8), 7.0, dtype=dtype, device=DEVICE)
    got = kernel(sd.kernels.tree_mask_at, valid, parents, present, first, buffer[:batch, :, :new, :width])
    assert got.data_ptr() == buffer.data_ptr() and torch.equal(got, want)
    untouched = torch.ones_like(buffer, dtype=torch.bool)
    untouched[:batch, :, :new, :width] = False
    assert bool((buffer[untouched] == 7.0).all())
    # = tree_mask over valid[:, :Lc] for the first Lc + M columns, hidden past them
    end = start + new
    assert torch.equal(want[..., :end], tree_mask_ref(valid[:, :start], parents, present, dtype).mask)
    assert bool((want[..., end:] == torch.finfo(dtype).min).all())


@needs_kernels
@pytest.mark.parametrize("batch,capacity,width,start,new,dtype", AT_CASES[1:],
                         ids=[f"B{b}-C{c}-W{w}-Lc{lc}-M{m}-{str(d)[6:]}" for b, c, w, lc, m, d in AT_CASES[1:]])
def test_tree_mask_at_without_present_takes_the_root_and_the_nodes_with_a_parent(batch, capacity, width, start, new,
                                                                                 dtype):
    """``present=None`` (the fast path's verify step, one launch fewer): the mask of ``present = parents >= 0`` or
    node 0, from the kernel and the reference."""
    g = torch.Generator().manual_seed(start + new + 1)
    valid = (torch.rand(batch, capacity, generator=g) < 0.8).to(DEVICE)
    parents, _ = pending_forest(start * 5 + new, batch, 0, new)
    parents = parents.to(DEVICE)
    parents[:, 0] = -1
    present = (parents >= 0) | (torch.arange(new, device=DEVICE) == 0)
    first = torch.tensor([start], device=DEVICE)
    want = sd.kernels.tree_mask_at_ref(valid, parents, present, first, torch.empty(batch, 1, new, width, dtype=dtype,
                                                                                   device=DEVICE))
    for fn in (sd.kernels.tree_mask_at_ref, lambda *a: kernel(sd.kernels.tree_mask_at, *a)):
        got = fn(valid, parents, None, first, torch.full((batch, 1, new, width), 7.0, dtype=dtype, device=DEVICE))
        assert torch.equal(got, want)


def test_tree_mask_at_reads_the_write_slot_from_the_device_and_rejects_bad_input():
    valid = torch.tensor([[True, False, True, True, True, True]])
    parents, present = torch.tensor([[-1, 0, -1]]), torch.tensor([[True, True, False]])
    out = torch.empty(1, 1, 3, 6)
    seen = [(sd.kernels.tree_mask_at(valid, parents, present, torch.tensor([lc]), out)[0, 0] == 0).int().tolist()
            for lc in (2, 3)]
    assert seen[0] == [[1, 0, 1, 0, 0, 0], [1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0]]
    assert seen[1] == [[1, 0, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    with pytest.raises(ValueError, match="one-element int64"):
        sd.kernels.tree_mask_at(valid, parents, present, torch.tensor([2, 3]), out)
    with pytest.raises(ValueError, match="W <= C"):
        sd.kernels.tree_mask_at(valid, parents, present, torch.tensor([2]), torch.empty(1, 1, 3, 7))
    with pytest.raises(ValueError, match="present must be"):
        sd.kernels.tree_mask_at(valid, parents, present[:, :2], torch.tensor([2]), out)


# ----------------------------------------------------------------------------------------------------------------
# The draft head's cache mask (same family): committed slots by length, frontier visibility over scratch slots
# ----------------------------------------------------------------------------------------------------------------


def frontier_visibility(seed: int, batch: int, nodes: int, scratch: int, broadcast: bool = False) -> torch.Tensor:
    """``visible [B, F, S]``: each frontier node sees itself (its own slot, among the last F) and random earlier
    slots; with ``broadcast``, one pattern expanded over the batch (stride 0, as StaticTree passes it)."""
    g = torch.Generator().manual_seed(seed)
    rows = 1 if broadcast else batch
    visible = torch.rand(rows, nodes, scratch, generator=g) < 0.3
    if nodes:
        own = torch.arange(scratch - nodes, scratch)
        visible[:, torch.arange(nodes), own] = True
        visible[:, :, scratch - nodes:] &= torch.eye(nodes, dtype=torch.bool)
    return visible.expand(batch, -1, -1) if broadcast else visible


# (batch, frontier F, scratch S, scratch start, capacity, dtype, broadcast visible)
HEAD_MASK_CASES = [
    (1, 1, 1, 0, 3, torch.bool, False),
    (1, 10, 10, 64, 128, torch.bool, True),
    (3, 4, 12, 37, 60, torch.float32, False),
    (2, 7, 21, 700, 1029, torch.bfloat16, False),
    (5, 3, 3, 5, 9, torch.float16, True),
    (2, 0, 0, 6, 11, torch.bool, False),
]


@needs_kernels
@pytest.mark.parametrize("batch,nodes,scratch,start,capacity,dtype,broadcast", HEAD_MASK_CASES,
                         ids=[f"B{b}-F{f}-S{s}-S0{s0}-C{c}-{str(d)[6:]}{'-bcast' if x else ''}"
                              for b, f, s, s0, c, d, x in HEAD_MASK_CASES])
def test_head_tree_mask_kernel_equals_reference(batch, nodes, scratch, start, capacity, dtype, broadcast):
    g = torch.Generator().manual_seed(capacity)
    lengths = torch.randint(0, start + 3, (batch,), generator=g).to(DEVICE)  # some past scratch_start: clipped
    visible = frontier_visibility(nodes + scratch, batch, nodes, scratch, broadcast).to(DEVICE)
    want = head_tree_mask_ref(lengths, visible, start, capacity, dtype)
    got = kernel(head_tree_mask, lengths, visible, start, capacity, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape == (batch, 1, nodes, capacity)
    assert got.stride() == want.stride() and got.stride(-2) % 8 == 0
    full = lambda m: torch.as_strided(m, (*m.shape[:-1], m.stride(-2)), m.stride())  # noqa: E731
    assert torch.equal(full(got), full(want))  # the alignment padding too
    buffer = torch.ones(batch + 1, 1, nodes + 2, capacity + 5, dtype=dtype, device=DEVICE)
    out = buffer[:batch, :, :nodes, :capacity]
    written = kernel(head_tree_mask, lengths, visible, start, capacity, dtype, out=out)
    assert torch.equal(written, want) and (nodes == 0 or written.data_ptr() == buffer.data_ptr())
    untouched = torch.ones(buffer.shape, dtype=torch.bool, device=DEVICE)
    untouched[:batch, :, :nodes, :capacity] = False
    assert bool((buffer[untouched] == 1).all())


def test_head_tree_mask_reference_is_the_eagle_drafters_former_construction():
    batch, nodes, scratch, start, capacity = 3, 4, 12, 20, 40
    lengths = torch.tensor([0, 7, 25])
    visible = frontier_visibility(1, batch, nodes, scratch)
    committed = torch.arange(start) < lengths[:, None]
    before = torch.cat([committed[:, None].expand(batch, nodes, start), visible,
                        visible.new_zeros(batch, nodes, capacity - start - scratch)], dim=-1)[:, None]
    assert torch.equal(head_tree_mask_ref(lengths, visible, start, capacity, torch.bool), before)
    assert torch.equal(head_tree_mask(lengths, visible, start, capacity, torch.bool), before)
    additive = head_tree_mask_ref(lengths, visible, start, capacity, torch.bfloat16)
    assert torch.equal(additive, to_aligned_additive_mask(before, torch.bfloat16))
    assert additive.stride() == to_aligned_additive_mask(before, torch.bfloat16).stride()


def test_head_tree_mask_rejects_bad_input_with_a_fix():
    lengths, visible = torch.tensor([3, 4]), torch.ones(2, 2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"bool tensor of shape \[B, F, S\]"):
        head_tree_mask(lengths, visible.long(), 5, 10, torch.bool)
    with pytest.raises(ValueError, match="inside the cache"):
        head_tree_mask(lengths, visible, 8, 10, torch.bool)
    with pytest.raises(ValueError, match="torch.bool"):
        head_tree_mask(lengths, visible, 5, 10, torch.int8)
    with pytest.raises(ValueError, match="preallocated buffer"):
        head_tree_mask(lengths, visible, 5, 10, torch.bool, out=torch.zeros(2, 1, 2, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        head_tree_mask(lengths.float(), visible, 5, 10, torch.bool)


UPDATE_CASES = [(1, 1, 16, torch.bool), (3, 7, 61, torch.float32), (2, 5, 130, torch.bfloat16),
                (4, 3, 9, torch.float16)]


@needs_kernels
@pytest.mark.parametrize("batch,entries,capacity,dtype", UPDATE_CASES,
                         ids=[f"B{b}-M{m}-C{c}-{str(d)[6:]}" for b, m, c, d in UPDATE_CASES])
def test_head_update_mask_kernel_equals_reference(batch, entries, capacity, dtype):
    g = torch.Generator().manual_seed(capacity + entries)
    lengths = torch.randint(0, capacity // 2, (batch,), generator=g)
    positions = lengths[:, None] + torch.arange(entries)  # an update's entries continue each row
    valid = torch.rand(batch, entries, generator=g) < 0.7
    valid[0] = False  # a row with nothing new: its length stays, last = -1
    if batch > 1:
        valid[1] = True
    lengths, positions, valid = lengths.to(DEVICE), positions.to(DEVICE), valid.to(DEVICE)
    want = head_update_mask_ref(lengths, positions, valid, capacity, dtype)
    got = kernel(head_update_mask, lengths, positions, valid, capacity, dtype)
    full = lambda m: torch.as_strided(m, (*m.shape[:-1], m.stride(-2)), m.stride())  # noqa: E731
    assert got.mask.shape == (batch, 1, entries, capacity) and got.mask.stride() == want.mask.stride()
    assert torch.equal(full(got.mask), full(want.mask))  # the alignment padding too
    for name in ("slots", "lengths", "last"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert int(want.last[0]) == -1 and int(want.lengths[0]) == int(lengths[0])


def test_head_update_mask_reference_is_the_eagle_drafters_former_construction():
    lengths, capacity = torch.tensor([3, 0]), 12
    positions = torch.tensor([[3, 4, 5], [0, 1, 2]])
    valid = torch.tensor([[True, True, False], [True, False, False]])
    s = torch.arange(capacity)
    new_len = torch.maximum(lengths, torch.where(valid, positions + 1, 0).amax(1))
    sees = (s < new_len[:, None, None]) & (s <= positions[:, :, None])
    sees |= ~valid[:, :, None] & (s == 0)
    got = head_update_mask(lengths, positions, valid, capacity, torch.bool)
    assert torch.equal(got.mask, sees[:, None]) and new_len.tolist() == got.lengths.tolist() == [5, 1]
    assert got.slots.tolist() == [[3, 4, 11], [0, 11, 11]] and got.last.tolist() == [1, 0]
    additive = head_update_mask(lengths, positions, valid, capacity, torch.bfloat16).mask
    assert torch.equal(additive, to_aligned_additive_mask(sees[:, None], torch.bfloat16))
    with pytest.raises(ValueError, match="M >= 1"):
        head_update_mask(lengths, positions[:, :0], valid[:, :0], capacity, torch.bool)
    with pytest.raises(ValueError, match="valid must have"):
        head_update_mask(lengths, positions, valid[:, :2], capacity, torch.bool)
    with pytest.raises(ValueError, match="torch.bool or a floating"):
        head_update_mask(lengths, positions, valid, capacity, torch.int32)


# ----------------------------------------------------------------------------------------------------------------
# Emitted tokens (vLLM's [B, K + 1] layout)
# ----------------------------------------------------------------------------------------------------------------


def verified_rows(seed: int, batch: int, nodes: int, depth: int):
    """Draft tokens ``[B, N]`` and a verify result (path ``[B, D + 1]``, counts, next tokens), different per row,
    rows that accept nothing included."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 151936, (batch, nodes), generator=g)
    path = torch.full((batch, depth + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    accepted = torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        n = int(torch.randint(0, min(depth, nodes) + 1, (1,), generator=g)) if nodes else 0
        accepted[b] = n
        path[b, 1:1 + n] = torch.randperm(nodes, generator=g)[:n] + 1
    return tokens, path, accepted, torch.randint(0, 151936, (batch,), generator=g)


@needs_kernels
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("nodes, depth", [(0, 0), (1, 1), (7, 3), (60, 8), (64, 64)])
def test_emitted_tokens_kernel_equals_reference(batch, nodes, depth):
    args = [t.to(DEVICE) for t in verified_rows(batch * 100 + nodes, batch, nodes, depth)]
    got, want = kernel(emitted_tokens, *args), reference(emitted_tokens, *args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    tokens, counts = want
    path, accepted, nxt = args[1:]
    for b in range(batch):  # the layout: accepted drafts in path order, the next token, then -1
        n = int(accepted[b])
        assert tokens[b, :n].tolist() == [int(args[0][b, int(path[b, j + 1]) - 1]) for j in range(n)]
        assert int(tokens[b, n]) == int(nxt[b]) and (tokens[b, n + 1:] == -1).all() and int(counts[b]) == n + 1


@needs_kernels
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("nodes, depth", [(0, 0), (1, 1), (7, 3), (60, 8), (64, 64)])
def test_accepted_feedback_kernel_equals_reference(batch, nodes, depth):
    draft_tokens, path, accepted, nxt = (t.to(DEVICE) for t in verified_rows(batch * 7 + nodes, batch, nodes, depth))
    tokens, counts = reference(emitted_tokens, draft_tokens, path, accepted, nxt)
    g = torch.Generator().manual_seed(batch)
    active = (torch.rand(batch, generator=g) < 0.8).to(DEVICE)
    keep = counts * active
    roots = torch.randint(0, 151936, (batch,), generator=g).to(DEVICE)
    lengths = torch.randint(0, 4096, (batch,), generator=g).to(DEVICE)
    for width in sorted({0, 1, int(keep.max()), depth + 1}):
        got = kernel(accepted_feedback, roots, tokens, keep, lengths, width)
        want = reference(accepted_feedback, roots, tokens, keep, lengths, width)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[:4], want[:4]))
        assert got.features == want.features == ()
    committed, following, positions, valid, _ = want
    assert (committed >= 0).all() and (following >= 0).all() and valid.dtype == torch.bool
    # [B] inputs that are strided views (columns of a captured step's inputs) are read right, not densely
    columns = torch.stack([roots, lengths, keep, torch.zeros_like(keep)], 1)  # [B, 4]: column views of stride 4
    got = kernel(accepted_feedback, columns[:, 0], tokens, columns[:, 2], columns[:, 1], depth + 1)
    want = reference(accepted_feedback, roots, tokens, keep, lengths, depth + 1)
    assert all(torch.equal(a, b) for a, b in zip(got[:4], want[:4]))
    got = kernel(emitted_tokens, draft_tokens, path, torch.stack([accepted, nxt], 1)[:, 0],
                 torch.stack([accepted, nxt], 1)[:, 1])
    assert all(torch.equal(a, b) for a, b in zip(got, (tokens, counts)))


@needs_kernels
@pytest.mark.parametrize("batch, nodes, width", [(1, 1, 1), (3, 61, 9), (8, 7, 0), (5, 64, 64)])
@pytest.mark.parametrize("layers", [(48,), (48, 48, 48), (1100, 1100, 1100, 1100, 1100), (48, 33, 48)])
def test_accepted_feedback_gathers_the_features_at_the_accepted_nodes_as_the_reference(batch, nodes, width, layers):
    g = torch.Generator().manual_seed(batch * 1000 + nodes + len(layers))
    # mixed shapes (two launches), five equal tensors (two launches of <= 4), hidden not a power of two and above
    # the 1024 block, a non-contiguous view (a slice of a wider buffer), bfloat16 beside float32
    features = []
    for i, hidden in enumerate(layers):
        wide = torch.randn(batch, nodes, hidden + 5, generator=g).to(DEVICE)
        f = wide[:, :, 2:2 + hidden]
        features.append(f.to(torch.bfloat16) if i == 2 and len(layers) == 3 and layers[0] != layers[1] else f)
    path = torch.randint(-1, nodes, (batch, width + 1), generator=g).to(DEVICE)  # wider than W: the first W read
    tokens = torch.randint(-1, 500, (batch, width + 1), generator=g).to(DEVICE)
    roots, lengths = torch.randint(0, 500, (batch,), generator=g).to(DEVICE), torch.arange(batch).to(DEVICE) + 7
    keep = torch.randint(0, width + 1, (batch,), generator=g).to(DEVICE)
    args = (roots, tokens, keep, lengths, width, features, path)
    got, want = kernel(accepted_feedback, *args), reference(accepted_feedback, *args)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got[:4], want[:4]))
    assert len(got.features) == len(want.features) == len(layers)
    for a, b, f in zip(got.features, want.features, features):
        assert a.dtype == b.dtype == f.dtype and a.shape == (batch, width, f.shape[-1]) and torch.equal(a, b)
    for b in range(batch):  # -1 padding reads node 0
        for j in range(width):
            assert torch.equal(want.features[0][b, j], features[0][b, max(int(path[b, j]), 0)])


def test_accepted_feedback_names_bad_input():
    z = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="nodes"):
        accepted_feedback_ref(z, torch.zeros(2, 3, dtype=torch.long), z, z, 2, [torch.zeros(2, 3, 4)], None)
    with pytest.raises(ValueError, match=r"features\[1\]"):
        accepted_feedback_ref(z, torch.zeros(2, 3, dtype=torch.long), z, z, 2,
                              [torch.zeros(2, 3, 4), torch.zeros(3, 3, 4)], torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="width"):
        accepted_feedback_ref(torch.zeros(2, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long),
                              torch.ones(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="roots"):
        accepted_feedback_ref(torch.zeros(3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long),
                              torch.ones(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), 1)


def test_emitted_tokens_is_what_verify_emitted_tokens_returns_and_names_bad_shapes():
    from specdec.types import Draft, DraftScheme, VerifyResult
    from specdec.verify import emitted_tokens as from_result

    tokens, path, accepted, nxt = verified_rows(0, 3, 7, 3)
    parents = torch.full((3, 8), -1, dtype=torch.long)
    draft = Draft(tokens=tokens, parents=parents, depths=torch.zeros_like(parents), draft_probs=None,
                  scheme=DraftScheme.DETERMINISTIC)
    result = VerifyResult(accepted_nodes=path, num_accepted=accepted, next_tokens=nxt)
    assert all(torch.equal(a, b) for a, b in zip(from_result(draft, result),
                                                 emitted_tokens_ref(tokens, path, accepted, nxt)))
    with pytest.raises(ValueError, match="VerifyResult"):
        emitted_tokens_ref(tokens, path, accepted[:2], nxt)


# ----------------------------------------------------------------------------------------------------------------
# KV compaction
# ----------------------------------------------------------------------------------------------------------------


def cache_tensors(seed, layers, batch, heads, length, head_dim, dtype, strided=False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(2 * layers):
        t = torch.randn(batch, heads, length + (3 if strided and i == 1 else 0), head_dim, generator=g).to(dtype)
        out.append((t[:, :, :length] if strided and i == 1 else t).to(DEVICE))
    return out[:layers], out[layers:]


def accepted_paths(seed, batch, pending, width):
    """keep ``[B, A]`` (increasing pending indices starting at the root, -1 padded) and counts ``[B]``; one row keeps
    only its root."""
    rng = random.Random(seed)
    keep = torch.full((batch, width), -1, dtype=torch.long)
    counts = torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        count = 1 if b == batch - 1 else rng.randint(1, width)
        keep[b, :count] = torch.tensor([0] + sorted(rng.sample(range(1, pending), count - 1)))
        counts[b] = count
    return keep.to(DEVICE), counts.to(DEVICE)


KV_CASES = [  # (layers, batch, heads, committed, pending, kept width, head_dim, dtype, one layer strided)
    (2, 1, 1, 0, 4, 3, 16, torch.float32, False),
    (3, 3, 2, 9, 12, 5, 24, torch.bfloat16, True),
    (4, 8, 2, 5, 9, 4, 64, torch.float16, False),
    (1, 3, 3, 70, 64, 7, 80, torch.float32, False),
]


@needs_kernels
@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("layers,batch,heads,committed,pending,width,head_dim,dtype,strided", KV_CASES)
def test_compact_kv_kernel_equals_reference(layers, batch, heads, committed, pending, width, head_dim, dtype, strided,
                                            inplace):
    keys, values = cache_tensors(committed + pending, layers, batch, heads, committed + pending, head_dim, dtype,
                                 strided)
    keep, counts = accepted_paths(width, batch, pending, width)
    ref_in = [t.clone() for t in keys], [t.clone() for t in values]
    ker_in = [t.clone() for t in keys], [t.clone() for t in values]
    want = compact_kv_ref(*ref_in, keep, counts, committed, inplace=inplace)
    got = kernel(compact_kv, *ker_in, keep, counts, committed, inplace=inplace)
    for w, k in zip(want[0] + want[1], got[0] + got[1]):
        assert w.shape == (batch, heads, committed + width, head_dim)
        assert torch.equal(w, k)  # every slot, padding included: the copy is exact
    if inplace:
        assert all(k.data_ptr() == t.data_ptr() for k, t in zip(got[0] + got[1], ker_in[0] + ker_in[1]))


@needs_kernels
@pytest.mark.parametrize("layers,batch,heads,committed,pending,width,head_dim,dtype,strided", KV_CASES)
def test_compact_kv_per_row_destinations(layers, batch, heads, committed, pending, width, head_dim, dtype, strided):
    # A static cache whose rows end at different slots (dest[b] <= Lc): every row's kept slots move left to its end.
    keys, values = cache_tensors(committed + pending + 1, layers, batch, heads, committed + pending, head_dim, dtype,
                                 strided)
    keep, counts = accepted_paths(width + 1, batch, pending, width)
    g = torch.Generator().manual_seed(batch + committed)
    dest = torch.randint(0, committed + 1, (batch,), generator=g)
    dest[0] = committed  # one row ends at Lc: its moves may overlap its own source slots
    dest = dest.to(DEVICE)
    ref_in = [t.clone() for t in keys], [t.clone() for t in values]
    ker_in = [t.clone() for t in keys], [t.clone() for t in values]
    compact_kv_ref(*ref_in, keep, counts, committed, inplace=True, dest=dest)
    kernel(compact_kv, *ker_in, keep, counts, committed, inplace=True, dest=dest)
    for before, r, k in zip(keys + values, ref_in[0] + ref_in[1], ker_in[0] + ker_in[1]):
        assert torch.equal(r, k)
        for b in range(batch):
            d, n = int(dest[b]), int(counts[b])
            for a in range(n):  # the kept slots, read before any move
                assert torch.equal(r[b, :, d + a], before[b, :, committed + int(keep[b, a])])
            assert torch.equal(r[b, :, :d], before[b, :, :d])  # nothing before the row's end moves
    with pytest.raises(ValueError, match="inplace"):
        compact_kv_ref(keys, values, keep, counts, committed, dest=dest)


@needs_kernels
@needs_kernels
@pytest.mark.parametrize("with_dest", [False, True], ids=["at_Lc", "per_row_dest"])
@pytest.mark.parametrize("layers,batch,heads,committed,pending,width,head_dim,dtype,strided", KV_CASES)
def test_a_compaction_plan_moves_what_compact_kv_moves(layers, batch, heads, committed, pending, width, head_dim,
                                                       dtype, strided, with_dest):
    # The static cache's plan (checked and grouped once) against compact_kv_ref in place, with both dispatches.
    keys, values = cache_tensors(committed + pending + 2, layers, batch, heads, committed + pending, head_dim, dtype,
                                 strided)
    keep, counts = accepted_paths(width + 2, batch, pending, width)
    dest = None
    if with_dest:
        dest = torch.randint(0, committed + 1, (batch,), generator=torch.Generator().manual_seed(batch)).to(DEVICE)
    want = [t.clone() for t in keys], [t.clone() for t in values]
    compact_kv_ref(*want, keep, counts, committed, inplace=True, dest=dest)
    for run in (kernel, reference):
        got = [t.clone() for t in keys], [t.clone() for t in values]
        plan = KVCompactPlan(*got)
        for _ in range(2 if run is kernel else 1):  # a second call reuses the groups and tables
            if _:
                got = [t.copy_(k) for t, k in zip(got[0], keys)], [t.copy_(v) for t, v in zip(got[1], values)]
            run(plan, keep, counts, committed, dest=dest)
            for w, g in zip(want[0] + want[1], got[0] + got[1]):
                assert torch.equal(w, g)
    with pytest.raises(ValueError, match="Lc \\+ A"):
        plan(keep, counts, committed + pending)
    with pytest.raises(ValueError, match="keep must be"):
        plan(keep[:1] if batch > 1 else keep[:, :, None], counts, committed)


@needs_kernels
@pytest.mark.parametrize("layers,batch,heads,committed,pending,width,head_dim,dtype,strided", KV_CASES)
def test_a_plan_moves_to_the_rows_ends_with_lc_read_on_the_device(layers, batch, heads, committed, pending, width,
                                                                  head_dim, dtype, strided):
    # move_to_ends(keep, base, dest) with Lc as a device scalar == compact_kv_ref(..., Lc, inplace, dest), both
    # dispatches; on CUDA a graph captured at one Lc replays right at another (the fast path's captured step).
    keys, values = cache_tensors(committed + pending + 4, layers, batch, heads, committed + pending + 2, head_dim,
                                 dtype, strided)
    keep, counts = accepted_paths(width + 3, batch, pending, width)
    dest = torch.randint(0, committed + 1, (batch,), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    dest[0] = committed  # moves that overlap their own sources
    for lc in (committed, committed + 2):
        want = [t.clone() for t in keys], [t.clone() for t in values]
        compact_kv_ref(*want, keep, counts, lc, inplace=True, dest=dest)
        for run in (kernel, reference):
            got = [t.clone() for t in keys], [t.clone() for t in values]
            run(KVCompactPlan(*got).move_to_ends, keep, torch.tensor([lc], device=DEVICE), dest)
            for w, g in zip(want[0] + want[1], got[0] + got[1]):
                assert torch.equal(w, g)
    with pytest.raises(ValueError, match="move_to_ends"):
        KVCompactPlan(keys, values).move_to_ends(keep, torch.tensor([0, 1], device=DEVICE), dest)
    if DEVICE != "cuda":
        return
    got = [t.clone() for t in keys], [t.clone() for t in values]
    plan, base = KVCompactPlan(*got), torch.tensor([committed], device=DEVICE)
    plan.move_to_ends(keep, base, dest)  # first launch outside the capture (pointer tables, compilation)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.move_to_ends(keep, base, dest)
    for t, k in zip(got[0] + got[1], keys + values):
        t.copy_(k)
    base.fill_(committed + 2)
    graph.replay()
    want = [t.clone() for t in keys], [t.clone() for t in values]
    compact_kv_ref(*want, keep, counts, committed + 2, inplace=True, dest=dest)
    for w, g in zip(want[0] + want[1], got[0] + got[1]):
        assert torch.equal(w, g)


def test_compact_kv_identity_prefix_and_empty_keep_are_views():
    keys, values = cache_tensors(0, 2, 3, 2, 10, 8, torch.float32)
    keep = torch.tensor([[0, 1, 2], [0, 1, -1], [0, -1, -1]], device=DEVICE)  # every row keeps a prefix
    counts = torch.tensor([3, 2, 1], device=DEVICE)
    for fn in (compact_kv_ref, lambda *a: kernel(compact_kv, *a)):
        ks, vs = fn(keys, values, keep, counts, 4)
        assert all(k.data_ptr() == t.data_ptr() and k.shape[2] == 7 for k, t in zip(ks + vs, keys + values))
        ks, _ = fn(keys, values, keep[:, :0], counts * 0, 4)
        assert all(k.shape[2] == 4 for k in ks)


def test_compact_kv_reference_is_what_the_adapter_commit_does():
    keys, values = cache_tensors(1, 3, 3, 2, 6 + 8, 16, torch.float32)
    keep, counts = accepted_paths(3, 3, 8, 4)
    layers = [SimpleNamespace(keys=k.clone(), values=v.clone()) for k, v in zip(keys, values)]
    valid = torch.ones(3, 6, dtype=torch.bool, device=DEVICE)
    empty = torch.empty(3, 0, dtype=torch.long, device=DEVICE)
    state = CacheState(SimpleNamespace(layers=layers), valid, valid.sum(1), torch.zeros(3, 8, dtype=torch.long,
                                                                                     device=DEVICE), empty.bool())
    ModelAdapter.commit(None, state, keep, counts)  # commit uses nothing of the adapter but the state
    ks, vs = compact_kv_ref(keys, values, keep, counts, 6)
    for layer, k, v in zip(layers, ks, vs):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


@needs_kernels
@pytest.mark.parametrize("batch,length,width,counts_dtype", [(1, 8, 1, torch.long), (3, 40, 7, torch.long),
                                                             (5, 300, 64, torch.int32), (2, 12, 0, torch.long)])
def test_kept_at_ends_kernel_equals_the_scatter_it_replaces(batch, length, width, counts_dtype):
    """The late commit's ``valid`` / ``ends`` update in one launch: the same ``valid`` bits and ``ends`` as the
    reference's scatter and add, for random ends (room for ``width`` slots), counts and prior ``valid`` bits."""
    from specdec.kernels import kept_at_ends, kept_at_ends_ref

    g = torch.Generator().manual_seed(batch * 100 + width)
    valid = (torch.rand(batch, length, generator=g) < 0.5).to(DEVICE)
    ends = torch.randint(0, length - width + 1, (batch,), generator=g).to(DEVICE)
    counts = torch.randint(0, width + 1, (batch,), generator=g).to(DEVICE, counts_dtype)
    want_valid, want_ends = valid.clone(), ends.clone()
    kept_at_ends_ref(want_valid, want_ends, counts, width)
    kernel(kept_at_ends, valid, ends, counts, width)
    assert torch.equal(valid, want_valid) and torch.equal(ends, want_ends)
    assert (want_ends <= length).all()


@needs_kernels
@pytest.mark.parametrize("batch,nodes,vocab", [(1, 1, 5), (3, 60, 97), (2, 200, 32000), (4, 0, 9)])
def test_sanitised_ids_and_packed_tokens_kernels_equal_the_torch_ops_they_replace(batch, nodes, vocab):
    """The verify step's id clamp (one launch for four) and the host copy's packing (one for two): the same ids,
    flags and packed rows as the references, ids outside ``[0, V)`` and absent nodes included."""
    from specdec.kernels import packed_tokens, packed_tokens_ref, sanitised_ids, sanitised_ids_ref

    g = torch.Generator().manual_seed(batch * 7 + nodes)
    tokens = torch.randint(-3, vocab + 3, (batch, nodes), generator=g).to(DEVICE)
    parents = torch.randint(-1, max(nodes, 1), (batch, nodes + 1), generator=g).to(DEVICE)
    want = sanitised_ids_ref(tokens, parents, vocab)
    got = kernel(sanitised_ids, tokens, parents, vocab)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and want[1].dtype == torch.bool
    assert bool(((want[0] >= 0) & (want[0] < vocab)).all())
    emitted = torch.randint(-1, vocab, (batch, 7), generator=g).to(DEVICE)
    counts = torch.randint(1, 8, (batch,), generator=g).to(DEVICE)
    for bad in (want[1], None):
        assert torch.equal(kernel(packed_tokens, counts, emitted, bad), packed_tokens_ref(counts, emitted, bad))
    strided = torch.randint(0, vocab, (batch, 2 * nodes), generator=g).to(DEVICE)[:, ::2]  # a non-unit stride
    assert torch.equal(kernel(sanitised_ids, strided, parents, vocab)[0], sanitised_ids_ref(strided, parents, vocab)[0])
    with pytest.raises(ValueError, match="parents \\[B, N \\+ 1\\]"):
        sanitised_ids(tokens, parents[:, 1:], vocab)
    with pytest.raises(ValueError, match="packed_tokens: counts"):
        packed_tokens(torch.zeros(batch + 1, dtype=torch.long, device=DEVICE), emitted, None)


def test_kept_at_ends_rejects_bad_input_with_a_fix():
    from specdec.kernels import kept_at_ends

    valid, ends = torch.zeros(2, 6, dtype=torch.bool), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="valid \\[B, L\\] bool"):
        kept_at_ends(valid.int(), ends, ends, 2)
    with pytest.raises(ValueError, match="width <= L"):
        kept_at_ends(valid, ends, ends, 7)
    with pytest.raises(ValueError, match="counts \\[B\\]"):
        kept_at_ends(valid, ends, torch.zeros(3, dtype=torch.long), 2)


def test_compact_kv_rejects_bad_input_with_a_fix():
    keys, values = cache_tensors(0, 2, 2, 1, 6, 4, torch.float32)
    keep, counts = torch.tensor([[0, 1]] * 2, device=DEVICE), torch.tensor([2, 2], device=DEVICE)
    with pytest.raises(ValueError, match="one per layer"):
        compact_kv(keys, values[:1], keep, counts, 2)
    with pytest.raises(ValueError, match="committed_len"):
        compact_kv(keys, values, keep, counts, 9)
    with pytest.raises(ValueError, match="use inplace=False"):
        compact_kv(keys, values, torch.zeros(2, 5, dtype=torch.long, device=DEVICE), counts, 3, inplace=True)


# ----------------------------------------------------------------------------------------------------------------
# Parallel-drafting inputs
# ----------------------------------------------------------------------------------------------------------------

PARALLEL_CASES = [  # (batch, verified width T, hidden H, K, dtype)
    (1, 1, 8, 1, torch.float32),
    (3, 5, 24, 4, torch.bfloat16),
    (8, 9, 1100, 7, torch.float16),
    (3, 4, 64, 64, torch.float32),
]


@needs_kernels
@pytest.mark.parametrize("batch,width,hidden,drafts,dtype", PARALLEL_CASES)
def test_parallel_draft_inputs_kernel_equals_reference(batch, width, hidden, drafts, dtype):
    g = torch.Generator().manual_seed(width * 31 + drafts)
    tokens = torch.randint(1000, (batch, width), generator=g).to(DEVICE)
    features = torch.randn(batch, width, hidden, generator=g).to(dtype).to(DEVICE)
    num_valid = torch.randint(1, width + 1, (batch,), generator=g)
    num_valid[-1] = 0 if batch > 1 else num_valid[-1]  # a finished row: all padding
    next_tokens = torch.randint(1000, (batch,), generator=g).to(DEVICE)
    start = torch.randint(0, 300, (batch,), generator=g).to(DEVICE)
    mask_hidden = torch.randn(hidden, generator=g).to(dtype).to(DEVICE)
    args = (tokens, features, num_valid.to(DEVICE), next_tokens, start, mask_hidden)
    kw = {"num_drafts": drafts, "mask_token_id": 1001, "pad_token_id": 1002}
    want = parallel_draft_inputs_ref(*args, **kw)
    got = kernel(parallel_draft_inputs, *args, **kw)
    for name, w, k in zip(want._fields, want, got):
        assert w.dtype == k.dtype and torch.equal(w, k), name


def test_parallel_draft_inputs_layout():
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    features = torch.arange(12.0).reshape(2, 3, 2)
    out = parallel_draft_inputs(tokens, features, torch.tensor([2, 3]), torch.tensor([50, 60]), torch.tensor([4, 0]),
                                torch.tensor([-1.0, -2.0]), num_drafts=3, mask_token_id=99, pad_token_id=0)
    assert out.input_ids.tolist() == [[6, 50, 99, 99, 0], [9, 10, 60, 99, 99]]
    assert out.positions.tolist() == [[4, 5, 6, 7, 8], [0, 1, 2, 3, 4]]
    assert out.hidden[0].tolist() == [[0, 1], [2, 3], [-1, -2], [-1, -2], [0, 0]]
    assert out.hidden[1].tolist() == [[6, 7], [8, 9], [10, 11], [-1, -2], [-1, -2]]
    assert out.is_masked.int().tolist() == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert out.is_rejected.int().tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    assert out.sample_indices.tolist() == [[1, 2, 3], [2, 3, 4]]
    with pytest.raises(ValueError, match="mask_hidden must have shape"):
        parallel_draft_inputs(tokens, features, torch.tensor([2, 3]), torch.tensor([50, 60]), torch.tensor([4, 0]),
                              torch.zeros(3), num_drafts=3, mask_token_id=99)


# ----------------------------------------------------------------------------------------------------------------
# Dispatch, the wired loop, the benchmark script
# ----------------------------------------------------------------------------------------------------------------


def test_dispatch_rule_and_mode_switch():
    cpu = torch.zeros(1)
    assert _dispatch.get_kernel_mode() == "auto"
    assert _dispatch.use_kernel("op", cpu) is False  # auto: the reference on CPU tensors
    with kernel_mode("torch"):
        assert _dispatch.use_kernel("op", cpu) is False
        with kernel_mode("triton"):
            assert _dispatch.get_kernel_mode() == "triton"
        assert _dispatch.get_kernel_mode() == "torch"
    assert _dispatch.get_kernel_mode() == "auto"
    with pytest.raises(ValueError, match="kernel mode must be one of"):
        _dispatch.set_kernel_mode("cuda")
    if torch.cuda.is_available() and triton_available():
        assert _dispatch.use_kernel("op", cpu.cuda()) is True


def test_import_without_triton_falls_back_to_the_references():
    code = ("import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
            "import torch, specdec.kernels as k\n"
            "assert not k.triton_available()\n"
            "m = k.tree_mask(torch.ones(1, 2, dtype=torch.bool), torch.tensor([[-1, 0]]), torch.ones(1, 2).bool(),"
            " torch.float32)\n"
            "assert m.mask.shape == (1, 1, 2, 4)\n"
            "try:\n    k.set_kernel_mode('triton'); k.tree_mask(torch.ones(1, 2, dtype=torch.bool),"
            " torch.tensor([[-1, 0]]), torch.ones(1, 2).bool(), torch.float32)\n"
            "except RuntimeError as e:\n    assert 'install triton' in str(e)\nelse:\n    raise SystemExit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120,
                   env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@needs_kernels
def test_generate_with_the_kernels_wired_in_is_token_identical():
    # generate() uses the kernels (mask fill, KV compaction, greedy verification) through their dispatchers:
    # forced to the Triton path (the interpreter on CPU), its output equals the references' and plain greedy.
    target = tiny_model("llama", scale=4.0).to(DEVICE)
    draft = tiny_model("llama", seed=1, layers=1).to(DEVICE)
    ids = torch.randint(1, 97, (2, 8), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    attention = torch.ones_like(ids)
    attention[1, :3] = 0
    drafter = sd.DraftModelDrafter(draft, num_drafts=3, tree=[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
    plain = sd.generate(target, ids, attention_mask=attention, max_new_tokens=12)
    with kernel_mode("torch"):
        reference = sd.generate(target, ids, attention_mask=attention, drafter=drafter, max_new_tokens=12)
    with kernel_mode("triton"):
        wired = sd.generate(target, ids, attention_mask=attention, drafter=drafter, max_new_tokens=12)
    assert torch.equal(wired.sequences, plain.sequences) and torch.equal(reference.sequences, plain.sequences)
    assert wired.stats.num_accepted_per_step == reference.stats.num_accepted_per_step
    assert wired.stats.tau > 1.0  # drafts were accepted, so paths were compacted and trees masked


def test_bench_script_runs_quick_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "examples" / "bench_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--quick", "--reps", "1", "--warmup", "0", "--out", str(tmp_path)])
    ops = {row["op"] for row in rows}
    assert {"tree_mask", "verify_greedy", "verify_chain_noise", "verify_tree_deterministic_noise", "compact_kv",
            "parallel_draft_inputs"} <= ops
    assert all(row["ref_ms"] > 0 for row in rows)
    assert (tmp_path / "bench_kernels.json").exists() and (tmp_path / "bench_kernels.md").exists()


def test_docstring_examples_run():
    import doctest
    import importlib

    for name in ("tree_mask", "verify", "kv_compact", "parallel_inputs", "_dispatch", "emit", "decoder_ops"):
        module = importlib.import_module(f"specdec.kernels.{name}")
        with kernel_mode("torch"):
            result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name


def test_programmatic_dependent_launch_is_on_only_where_it_can_run_and_set_pdl_turns_it_off():
    """pdl_launch(): no keywords under the interpreter, without CUDA, or after set_pdl(False); on an sm_90 GPU the
    launch keywords, early (PDL=2) by default, one ahead (PDL=True) with early=False, PDL=3 for a prefetching
    kernel; set_pdl(None) restores the default."""
    from specdec.kernels import _triton

    try:
        if _triton.INTERPRETED or not torch.cuda.is_available():
            assert _triton.pdl_launch() == {} and not _triton.pdl_enabled()
            assert _triton.pdl_launch(prefetch=True) == {} and _triton.prefetch_bytes(torch.zeros(4, 64)) == 0
        else:
            hopper = torch.cuda.get_device_capability() >= (9, 0) and _triton.gdc_wait is not None
            _triton.set_pdl(True, early=True)
            assert _triton.pdl_enabled() == hopper
            assert _triton.pdl_launch() == ({"PDL": 2, "launch_pdl": True} if hopper else {})
            assert _triton.pdl_launch(prefetch=True) == ({"PDL": 3, "launch_pdl": True} if hopper else {})
            _triton.set_pdl(True, early=False)
            assert _triton.pdl_launch() == ({"PDL": True, "launch_pdl": True} if hopper else {})
            assert _triton.pdl_launch(prefetch=True) == _triton.pdl_launch()
            assert _triton.prefetch_bytes(torch.zeros(4, 64, device="cuda")) == 0
        _triton.set_pdl(False)
        assert _triton.pdl_launch() == {} and _triton.prefetch_bytes(torch.zeros(4, 64)) == 0
    finally:
        _triton.set_pdl(None)


def test_weights_are_prefetched_only_in_the_early_order_from_aligned_rows_and_the_variables_override(monkeypatch):
    """prefetch_bytes(): 0 unless a launch is early (here faked) and every weight row starts on 16 bytes (the bulk
    prefetch's alignment: a float8 row of 1,000 bytes does not), then the variable's value or the default."""
    from specdec.kernels import _triton

    w = torch.zeros(8, 256, dtype=torch.bfloat16)
    monkeypatch.setattr(_triton, "pdl_launch", lambda prefetch=False: {"PDL": 2, "launch_pdl": True})
    assert _triton.prefetch_bytes(w) == _triton.PREFETCH_DEFAULTS["SPECDEC_PREFETCH"] == 128
    assert _triton.prefetch_bytes(w, "SPECDEC_PREFETCH_VERIFY") == 0
    monkeypatch.setenv("SPECDEC_PREFETCH_VERIFY", "1024")
    assert _triton.prefetch_bytes(w, "SPECDEC_PREFETCH_VERIFY") == 1024
    assert _triton.prefetch_bytes(torch.zeros(8, 1000, dtype=torch.uint8)) == 0  # rows 1,000 bytes apart
    assert _triton.prefetch_bytes(torch.zeros(8, 1024, dtype=torch.uint8)[:, 8:]) == 0  # the first row at 8 bytes
    monkeypatch.setattr(_triton, "pdl_launch", lambda prefetch=False: {"PDL": True, "launch_pdl": True})
    assert _triton.prefetch_bytes(w, "SPECDEC_PREFETCH_VERIFY") == 0 and _triton.prefetch_bytes(w) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_chain_of_kernels_gives_the_same_bits_with_and_without_pdl(monkeypatch):
    """A CUDA graph of dependent kernels (norm, one-row products, SiLU, norm again, then 10-row skinny, float8 and
    4-bit products with their weights prefetched) captured without programmatic dependent launch, one kernel
    ahead and early: the same bits over replays with new inputs (a kernel launched early waits for its inputs)."""
    from specdec.graphs import capture_graph
    from specdec.kernels import (
        _triton,
        add_rms_norm,
        linear_fp8,
        linear_int4,
        linear_rows,
        linear_skinny,
        pack_int4,
        quantize_fp8_rows,
        silu_mul,
    )

    torch.manual_seed(0)
    w1 = torch.randn(2 * 688, 256, device="cuda", dtype=torch.bfloat16) / 16
    w2 = torch.randn(256, 688, device="cuda", dtype=torch.bfloat16) / 16
    norm = torch.rand(256, device="cuda", dtype=torch.bfloat16) + 0.5
    w8, s8 = quantize_fp8_rows(w1)
    w4 = pack_int4(w2.float(), group=128)
    monkeypatch.setenv("SPECDEC_PREFETCH", "512")
    monkeypatch.setenv("SPECDEC_PREFETCH_VERIFY", "512")

    def chain(x, r):
        h, y = add_rms_norm(x, r, norm, 1e-6)
        for _ in range(4):
            h, y = add_rms_norm(h, linear_rows(silu_mul(linear_rows(y, w1)), w2), norm, 1e-6)
        wide = y.expand(10, 256) * torch.arange(1, 11, device="cuda", dtype=y.dtype)[:, None]
        z = linear_skinny(silu_mul(linear_fp8(wide, w8, s8)), w2)
        return h, y, linear_int4(silu_mul(linear_skinny(z, w1)), w4)

    inputs = [(torch.randn(1, 256, device="cuda", dtype=torch.bfloat16),
               torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
    outs = {}
    try:
        for pdl in (False, True, "early"):
            _triton.set_pdl(bool(pdl), early=pdl == "early")
            x, r = (t.clone() for t in inputs[0])
            runner = capture_graph(chain, (x, r))
            got = []
            for a, b in inputs:
                got.append(tuple(t.clone() for t in runner(a, b)))
            outs[pdl] = got
    finally:
        _triton.set_pdl(None)
    for mode in (True, "early"):
        for want, got in zip(outs[False], outs[mode]):
            assert all(torch.equal(a, b) for a, b in zip(want, got)), mode
        assert not torch.equal(outs[mode][0][2], outs[mode][1][2])  # the replays did read their new inputs
