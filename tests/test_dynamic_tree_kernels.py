"""The dynamic tree's per-level and rerank kernels against their torch references (bit for bit)."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels import (
    TreeFrontier,
    dynamic_tree_level,
    dynamic_tree_level_ref,
    interpreter_enabled,
    kernel_mode,
    new_candidates,
    rerank_candidates,
    rerank_candidates_ref,
    triton_available,
)
from specdec.trees import grow_dynamic_tree, grow_dynamic_tree_ref

DEVICES = (["cpu"] if interpreter_enabled() else []) + (["cuda"] if torch.cuda.is_available() else [])
needs_kernel = pytest.mark.skipif(not DEVICES or not triton_available(), reason="needs triton on CUDA or interpreted")


def _lp(shape, g, ties):
    """Sorted (best first) log-probabilities per last dim, as log_softmax_topk gives; coarse values make ties."""
    x = -torch.rand(*shape, generator=g) * 4
    if ties:
        x = (x * 2).round() / 2
    x[..., 0] = torch.where(torch.rand(shape[:-1], generator=g) < 0.2, torch.tensor(1e-7), x[..., 0])  # > 0: clamped
    return x.sort(dim=-1, descending=True).values


def _frontier(B, k, S, H, g, dtype, device, ties):
    scores = -torch.rand(B, k, generator=g) * 3
    if ties:
        scores = (scores * 2).round() / 2
    return TreeFrontier(scores.to(device), torch.randint(0, 1000, (B, k), generator=g).to(device),
                        torch.randint(0, 50, (B, k), generator=g).to(device),
                        torch.randn(B, k, H, generator=g).to(device, dtype),
                        (torch.rand(B, k, S, generator=g) < 0.5).to(device))


def _level_both(B, k, depth, H, S, offset, root, advance, ties, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (B, k) if root else (B, k, k)
    lp = _lp(shape, g, ties).to(device)
    tok = torch.randint(0, 32000, shape, generator=g).to(device)
    frontier = None if root else _frontier(B, k, S, H, g, dtype, device, ties)
    hidden = torch.randn(*((B, H) if root else (B, k, H)), generator=g).to(device, dtype)
    outs = []
    for mode, fn in (("triton", dynamic_tree_level), ("torch", dynamic_tree_level_ref)):
        cands = new_candidates(B, k, depth, device)
        for t in cands:
            t.fill_(-1000)  # untouched entries must stay untouched by both
        with kernel_mode(mode):
            nxt = fn(cands, offset, lp, tok, frontier, hidden, advance=advance)
        outs.append((cands, nxt))
    return outs


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,k,root,advance,ties,dtype", [
    (1, 10, True, True, False, torch.float32), (2, 10, False, True, False, torch.float32),
    (3, 4, False, True, True, torch.bfloat16), (2, 10, False, False, True, torch.float32),
    (1, 3, True, False, True, torch.bfloat16), (2, 16, False, True, True, torch.float32),
])
def test_a_level_on_the_kernel_equals_the_reference(device, B, k, root, advance, ties, dtype):
    depth, H, S = 4, 48, 2 * k
    offset = 0 if root else k + k * k
    (kc, kn), (rc, rn) = _level_both(B, k, depth, H, S, offset, root, advance, ties, dtype, device, seed=k + B)
    for a, b in zip(kc, rc):
        assert torch.equal(a, b)
    written = slice(offset, offset + (k if root else k * k))
    assert (rc.scores[:, written] != -1000).all() and (rc.scores[:, :offset] == -1000).all()
    if not advance:
        assert kn is None and rn is None
        return
    for name, a, b in zip(TreeFrontier._fields, kn, rn):
        assert a.shape == b.shape and torch.equal(a, b), name
    assert kn.visible.shape == (B, k, (0 if root else S) + k)


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,k,depth,total,ties", [(1, 10, 6, 60, False), (3, 10, 6, 60, True), (2, 3, 4, 12, True),
                                                   (2, 4, 3, 200, False), (1, 2, 2, 2, True), (2, 16, 3, 80, True)])
def test_the_rerank_on_the_kernel_equals_two_stable_sorts(device, B, k, depth, total, ties):
    g = torch.Generator().manual_seed(B * 100 + k)
    cands = new_candidates(B, k, depth, device)
    C = cands.scores.shape[1]
    scores = -torch.rand(B, C, generator=g) * 6
    if ties:
        scores = (scores * 2).round() / 2
    scores[:, -3:] = float("-inf")  # -inf candidates rank last, by index among themselves
    cands.scores.copy_(scores)
    cands.tokens.copy_(torch.randint(0, 32000, (B, C), generator=g))
    # each candidate's parent: a candidate of the level before (the root's children: -1)
    level_start = [0, k] + [k + i * k * k for i in range(1, depth)]
    parents = torch.full((B, C), -1)
    for lvl in range(1, depth):
        lo, hi = level_start[lvl], level_start[lvl + 1]
        parents[:, lo:hi] = torch.randint(level_start[lvl - 1], lo, (B, hi - lo), generator=g)
    cands.parents.copy_(parents)
    with kernel_mode("triton"):
        got = rerank_candidates(cands, k, total)
    want = rerank_candidates_ref(cands, k, total)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a, b)
    n = min(total - 1, C)
    assert got[0].shape == (B, n) and (got[1][:, 0] == -1).all() and (got[2][:, 0] == 0).all()


@needs_kernel
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ties", [False, True])
def test_grow_dynamic_tree_on_the_kernels_equals_the_literal_reference(device, ties):
    """The whole tree with every level and the rerank on the kernels against the paper's steps in Python (and, with
    ties, against the same code on the references)."""
    V, H, B = 50, 8, 2
    g = torch.Generator().manual_seed(3)
    proj = torch.randn(H, V, generator=g)
    if ties:
        proj = proj.round()
    proj = proj.to(device)

    def expand(tokens, parent_hidden, visible, level):
        hidden = torch.tanh(parent_hidden + tokens[..., None].float().to(device) / V)
        return hidden @ proj, hidden

    root = torch.randn(B, V, generator=g).round().to(device) if ties else torch.randn(B, V, generator=g).to(device)
    hidden = torch.randn(B, H, generator=g).to(device)
    with kernel_mode("triton"):
        got = grow_dynamic_tree(root, hidden, expand, depth=5, top_k=4, total_tokens=30)
    if ties:  # the literal reference's torch.topk breaks ties its own way: the same code on the references instead
        with kernel_mode("torch"):
            want = grow_dynamic_tree(root, hidden, expand, depth=5, top_k=4, total_tokens=30)
    else:
        want = grow_dynamic_tree_ref(root, hidden, expand, depth=5, top_k=4, total_tokens=30)
    assert torch.equal(got.tokens.cpu(), want.tokens.cpu())
    assert torch.equal(got.parents.cpu(), want.parents.cpu())
    assert torch.equal(got.depths.cpu(), want.depths.cpu())


def test_bad_shapes_name_the_argument():
    cands = new_candidates(2, 3, 3, "cpu")
    with pytest.raises(ValueError, match="child_lp and child_tokens"):
        dynamic_tree_level(cands, 0, torch.zeros(2, 3), torch.zeros(2, 4, dtype=torch.long), None, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="new_candidates"):
        dynamic_tree_level(cands, 0, torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.long), None, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="offset"):
        dynamic_tree_level(cands, 20, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), None,
                           torch.zeros(2, 5))
    with pytest.raises(ValueError, match="hidden"):
        dynamic_tree_level(cands, 0, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), None,
                           torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="k \\+ \\(D - 1\\) k\\^2"):
        rerank_candidates(cands, 4, 10)
    with pytest.raises(ValueError, match="total_tokens"):
        rerank_candidates(cands, 3, 1)
