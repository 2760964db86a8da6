"""DraftModelDrafter(fast=True): the draft model on a StaticAdapter gives the eager drafter's drafts and tokens.

CPU runs the static code eagerly; the ``gpu`` tests run it with the draft model's bucket forwards captured as CUDA
graphs (skipped without CUDA).
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from tiny_models import VOCAB, noisy_copy, tiny_model

from specdec.drafters.draft_model import DraftModelDrafter
from specdec.generate import generate
from specdec.sampling import TorchSource
from specdec.static import CapacityError, StaticAdapter, capacity_for

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA GPU")])
DEVICES = ["cpu", CUDA]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def _prompts(batch: int, device: str, T: int = 12, seed: int = 0):
    """Left-padded random prompts; row b has 3 * (b % 3) pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, T), generator=g)
    mask = torch.ones(batch, T, dtype=torch.long)
    for b in range(batch):
        mask[b, :3 * (b % 3)] = 0
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def _pair(model, **kw):
    """An eager and a fast drafter over the same (noisy) draft model."""
    draft = noisy_copy(model, 0.3)
    return DraftModelDrafter(draft, **kw), DraftModelDrafter(draft, fast=True, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["chain", "tree"])
def test_fast_draft_model_gives_the_eager_tokens_and_acceptance(kind, batch, device):
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(batch, device)
    kw = dict(num_drafts=4) if kind == "chain" else dict(num_drafts=3, tree=TREE)
    eager_drafter, fast_drafter = _pair(model, **kw)
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    eager = generate(model, ids, attention_mask=mask, drafter=eager_drafter, max_new_tokens=20, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=fast_drafter, max_new_tokens=20, eos_token_id=[])
    assert isinstance(fast_drafter.adapter, StaticAdapter) and not isinstance(eager_drafter.adapter, StaticAdapter)
    assert torch.equal(fast.sequences, plain.sequences)
    assert torch.equal(fast.sequences, eager.sequences)
    # Same drafts, hence the same number of target forwards (every step verified the same tree).
    assert fast.stats.num_target_forwards == eager.stats.num_target_forwards
    assert fast.stats.tau == eager.stats.tau and fast.stats.tau > 1.0
    if kind == "chain":  # the greedy chain drafts in one captured step (capture_chain, the default)
        store = fast_drafter.adapter._store.buffers.runners
        assert any(isinstance(key, tuple) and key[0] == "chain" for key in store)
    elif device == "cuda":  # the tree's single-node last level replays bucket 1
        assert 1 in fast_drafter.adapter.captured_buckets


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("fast", [True, False])
def test_a_captured_chain_drafts_what_the_level_by_level_chain_drafts(batch, device, fast):
    """capture_chain=True: the pending tokens and the K - 1 levels as one captured step (forward_chain), with the
    target on the eager or the fast path: the same tokens, target forwards and tau as level by level."""
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(batch, device)
    draft = noisy_copy(model, 0.3)
    runs = []
    for capture_chain in (False, True):
        drafter = DraftModelDrafter(draft, num_drafts=4, fast=True, capture_chain=capture_chain,
                                    capacity=capacity_for(ids.shape[1], 24, 16))
        runs.append(generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=20, eos_token_id=[],
                             fast=fast))
        if capture_chain:
            keys = [k for k in drafter.adapter._store.buffers.runners if isinstance(k, tuple) and k[0] == "chain"]
            assert keys, "the captured chain was not used"
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(runs[1].sequences, runs[0].sequences)
    assert torch.equal(runs[1].sequences, plain.sequences)
    assert runs[1].stats.num_target_forwards == runs[0].stats.num_target_forwards
    assert runs[1].stats.tau == runs[0].stats.tau > 1.0


@pytest.mark.parametrize("compiled", [False, True])
def test_forward_chain_equals_forward_level_by_level(compiled):
    """StaticAdapter.forward_chain against forward() then K - 1 one-token forward() calls: the same argmax chain,
    the same pending parents and presence, the same keys written; also with the forwards compiled (dynamo's eager
    backend here) as fast="compile" does."""
    from specdec.graphs import capture_graph_ref
    from specdec.static import compiled_capture

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(2, "cpu")
    K = 4
    results = []
    for chained in (False, True):
        capture = (compiled_capture(lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=0), backend="eager")
                   if compiled and chained else None)
        ad = StaticAdapter(model, capacity=capacity_for(ids.shape[1], 16, 16), buckets=(1, 2, 4, 8),
                           capture=capture)
        _, st = ad.prefill(ids, mask)
        tokens = torch.tensor([[5, 7, 0], [9, 0, 0]])  # pending committed tokens; row 1 holds one
        counts = torch.tensor([2, 1])
        ar = torch.arange(3)[None]
        present = ar < counts[:, None]
        parents = (ar - 1).expand(2, 3).masked_fill(~present, -1)
        positions = st.lengths[:, None] + ar
        root = counts - 1
        if chained:
            drafts, st = ad.forward_chain(st, tokens, parents, positions, present, root, K)
        else:
            out, st = ad.forward(st, tokens, parents, positions, present)
            tok = out.logits.gather(1, root[:, None, None].expand(2, 1, out.logits.shape[-1]))[:, 0].argmax(-1)
            drafts = [tok]
            for j in range(1, K):
                parent = (root if j == 1 else torch.full_like(root, 3 + j - 2))[:, None]
                out, st = ad.forward(st, tok[:, None], parent, positions.gather(1, root[:, None]) + j)
                tok = out.logits[:, 0].argmax(-1)
                drafts.append(tok)
            drafts = torch.stack(drafts, 1)
        keys = ad._store.buffers.cache.layers[0].keys[:, :, st.committed:st.committed + st.num_pending].clone()
        results.append((drafts, st.pending_parents, st.pending_present, keys))
    for mine, ref in zip(results[1], results[0]):
        torch.testing.assert_close(mine, ref)
    with pytest.raises(ValueError, match="num_levels must be >= 1"):
        StaticAdapter(model, capacity=64).forward_chain(None, tokens, parents, positions, present, root, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_fast_draft_model_with_the_target_on_the_fast_path_too(device):
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(3, device)
    eager_drafter, fast_drafter = _pair(model, num_drafts=5)
    eager = generate(model, ids, attention_mask=mask, drafter=eager_drafter, max_new_tokens=16, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=fast_drafter, max_new_tokens=16, eos_token_id=[],
                    fast=True)
    again = generate(model, ids, attention_mask=mask, drafter=fast_drafter, max_new_tokens=16, eos_token_id=[],
                     fast=True)  # a second run reuses the drafter's static buffers (and graphs on CUDA)
    assert torch.equal(fast.sequences, eager.sequences) and torch.equal(again.sequences, eager.sequences)


@pytest.mark.parametrize("mode", ["sample", "sample_iid"])
def test_sampled_drafts_make_the_same_decisions_under_the_same_seed(mode):
    model = tiny_model("llama")
    ids, mask = _prompts(3, "cpu")
    eager_drafter, fast_drafter = _pair(model, num_drafts=3, tree=TREE, mode=mode)
    runs = [generate(model, ids, attention_mask=mask, drafter=d, max_new_tokens=12, temperature=1.0,
                     source=TorchSource(torch.Generator().manual_seed(7)), eos_token_id=[])
            for d in (eager_drafter, fast_drafter)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.num_target_forwards == runs[1].stats.num_target_forwards


def test_capacity_too_small_is_refused_and_unsupported_drafts_run_eagerly():
    model = tiny_model("llama")
    ids, mask = _prompts(1, "cpu", T=40)
    small = DraftModelDrafter(copy.deepcopy(model), num_drafts=3, fast=True, capacity=44)
    with pytest.raises(ValueError, match="capacity_for"):
        generate(model, ids, attention_mask=mask, drafter=small, max_new_tokens=8)
    short = DraftModelDrafter(copy.deepcopy(model), num_drafts=3, fast=True, capacity=64)
    with pytest.raises(CapacityError, match="full"):  # 40 + 30 tokens do not fit in 64 slots: refused, not wrapped
        generate(model, ids, attention_mask=mask, drafter=short, max_new_tokens=30, eos_token_id=[])
    sized = DraftModelDrafter(copy.deepcopy(model), num_drafts=3, fast=True, capacity=capacity_for(40, 8, 128))
    generate(model, ids, attention_mask=mask, drafter=sized, max_new_tokens=8)
    assert sized.adapter.capacity == capacity_for(40, 8, 128)
    windowed = tiny_model("mistral")
    windowed.config.sliding_window = 256
    drafter = DraftModelDrafter(windowed, num_drafts=3, fast=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = generate(windowed, ids, attention_mask=mask, drafter=drafter, max_new_tokens=8)
    assert any("runs eagerly" in str(w.message) and "sliding window" in str(w.message) for w in caught)
    assert not isinstance(drafter.adapter, StaticAdapter)
    assert torch.equal(out.sequences, generate(windowed, ids, attention_mask=mask, max_new_tokens=8).sequences)
