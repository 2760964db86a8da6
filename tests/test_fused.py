"""The fused decoder (specdec/fused.py) against HF's own forward, and how the static adapter keeps it current."""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, tiny_model
from torch import nn

from specdec.adapter import ModelAdapter, UnsupportedModelError
from specdec.fused import FusedDecoder, fused_support
from specdec.static import StaticAdapter, capacity_for, slot_cache, use_fused

COVERED = ["llama", "mistral", "qwen2", "qwen3"]


def _tree_mask(T: int, S: int, dtype=torch.float32) -> torch.Tensor:
    """``[1, 1, T, S]`` additive: node t sees node 0 and itself and every even node before it (a tree-like,
    non-causal pattern); slots past ``T`` are hidden."""
    allowed = torch.zeros(T, S, dtype=torch.bool)
    for t in range(T):
        allowed[t, 0] = allowed[t, t] = True
        allowed[t, :t:2] = True
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[None, None]


@pytest.mark.parametrize("arch", COVERED)
def test_the_fused_forward_equals_hf_logits_and_every_hidden_state_under_a_tree_mask(arch):
    model = tiny_model(arch)  # 2 layers
    assert fused_support(model) is None
    B, T, S = 2, 7, 16
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    positions = torch.tensor([[0, 1, 1, 2, 2, 3, 4], [3, 4, 4, 5, 6, 6, 7]])  # siblings share positions
    mask = _tree_mask(T, S).expand(B, 1, T, S).contiguous()
    ref = model(input_ids=tokens, attention_mask=mask[:, :, :, :T], position_ids=positions, output_hidden_states=True)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = slot_cache([((B, config.num_key_value_heads, S, head_dim), torch.float32)] * 2, torch.device("cpu"))
    dec = FusedDecoder(model, max_positions=32)
    logits, feats = dec(tokens, positions, mask, torch.arange(T), cache.layers, (0, 1, 2))
    torch.testing.assert_close(logits, ref.logits, atol=2e-6, rtol=1e-5)
    assert len(feats) == 3 == len(ref.hidden_states)
    for mine, theirs in zip(feats, ref.hidden_states):  # 0 embeddings, 1 layer 0's output, 2 the final normed state
        torch.testing.assert_close(mine, theirs, atol=2e-6, rtol=1e-5)
    assert cache.layers[0].keys[:, :, T:].abs().sum() == 0  # nothing written past the slots given
    assert cache.layers[0].keys[:, :, :T].abs().sum() > 0


@pytest.mark.parametrize("arch", ["gemma", "gpt_neox", "phi3"])
def test_models_it_does_not_cover_are_named_and_run_on_hf_modules(arch):
    model = tiny_model(arch)
    reason = fused_support(model)
    assert reason and "model_type" in reason
    with pytest.raises(UnsupportedModelError, match="fused=False"):
        StaticAdapter(model, capacity=64, fused=True)
    assert StaticAdapter(model, capacity=64).fused is False


def test_a_replaced_projection_is_refused():
    model = tiny_model("llama")
    model.model.layers[1].mlp.up_proj = nn.Sequential(model.model.layers[1].mlp.up_proj)
    assert "layer 1's up_proj" in fused_support(model)
    with pytest.raises(ValueError, match="fused must be"):
        StaticAdapter(tiny_model("llama"), capacity=64, fused="yes")


def _prefill_then_tree(adapter, model, ids, mask=None):
    """Prefill, then one 3-node chain forward; returns its logits."""
    _, state = adapter.prefill(ids, mask)
    dev = ids.device
    tokens = torch.tensor([[5, 6, 7]], device=dev).expand(ids.shape[0], 3)
    parents = torch.tensor([[-1, 0, 1]], device=dev).expand(ids.shape[0], 3)
    positions = state.lengths[:, None] + torch.arange(3, device=dev)
    out, _ = adapter.forward(state, tokens, parents, positions)
    return out.logits


def test_weights_changed_in_place_or_replaced_are_seen_at_the_next_prefill():
    model = tiny_model("llama")
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    fast = StaticAdapter(model, capacity=capacity_for(9, 8, 16), buckets=(4,))
    eager = ModelAdapter(model)
    before = _prefill_then_tree(fast, model, ids)
    torch.testing.assert_close(before, _prefill_then_tree(eager, model, ids), atol=2e-5, rtol=1e-5)
    decoder = fast._store.fused
    with torch.no_grad():  # an optimizer-like in-place update of a fused projection
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
        model.model.layers[1].mlp.gate_proj.weight.add_(0.05)
    after = _prefill_then_tree(fast, model, ids)
    assert fast._store.fused is decoder  # same decoder, copies refreshed in place
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, _prefill_then_tree(eager, model, ids), atol=2e-5, rtol=1e-5)
    mlp = model.model.layers[1].mlp  # a parameter replaced by a new tensor: a new decoder (and new graphs)
    mlp.up_proj.weight = nn.Parameter(mlp.up_proj.weight.detach() * 0.5)
    replaced = _prefill_then_tree(fast, model, ids)
    assert fast._store.fused is not decoder
    torch.testing.assert_close(replaced, _prefill_then_tree(eager, model, ids), atol=2e-5, rtol=1e-5)
    decoder = fast._store.fused  # new memory behind the same parameter object (no version bump): rebuilt too
    attn = model.model.layers[0].self_attn
    attn.v_proj.weight.data = attn.v_proj.weight.data * -1.0
    swapped = _prefill_then_tree(fast, model, ids)
    assert fast._store.fused is not decoder
    torch.testing.assert_close(swapped, _prefill_then_tree(eager, model, ids), atol=2e-5, rtol=1e-5)


def test_the_fused_path_does_not_modify_the_model():
    model = tiny_model("qwen2")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    _prefill_then_tree(StaticAdapter(model, capacity=64, buckets=(4,)), model, ids)
    for k, v in model.state_dict().items():
        assert v.data_ptr() == ptrs[k] and torch.equal(v, state[k]), k


def test_use_fused_sets_what_fused_none_means_within_a_block():
    model = tiny_model("llama")
    assert StaticAdapter(model, capacity=64).fused is True
    with use_fused(False):
        assert StaticAdapter(model, capacity=64).fused is False
        assert StaticAdapter(model, capacity=64, fused=True).fused is True  # an explicit choice wins
    assert StaticAdapter(model, capacity=64).fused is True
    with pytest.raises(ValueError, match="use_fused takes"):
        with use_fused("on"):
            pass


def test_masked_attention_may_use_cudnn_only_inside_fixed_shape_blocks():
    from torch.nn.attention import SDPBackend

    from specdec.nn import fixed_shape_attention, masked_sdpa_backends

    assert SDPBackend.CUDNN_ATTENTION not in masked_sdpa_backends()
    with fixed_shape_attention():
        with fixed_shape_attention():
            assert masked_sdpa_backends()[0] == SDPBackend.CUDNN_ATTENTION
        assert masked_sdpa_backends()[0] == SDPBackend.CUDNN_ATTENTION
    assert SDPBackend.CUDNN_ATTENTION not in masked_sdpa_backends()



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_captured_steps_may_use_cudnn_and_bf16_forwards_stay_close_to_the_eager_ones():
    from torch.nn.attention import SDPBackend

    from specdec.graphs import capture_graph
    from specdec.nn import masked_sdpa_backends

    seen = []
    step = capture_graph(lambda x: (seen.append(masked_sdpa_backends()[0]), x * 2)[1], (torch.ones(2).cuda(),))
    assert seen and all(b == SDPBackend.CUDNN_ATTENTION for b in seen)
    assert torch.equal(step(torch.ones(2).cuda()), torch.full((2,), 2.0).cuda())
    model = tiny_model("llama").to("cuda", torch.bfloat16)
    ids = torch.randint(1, VOCAB, (2, 70), generator=torch.Generator().manual_seed(0)).cuda()
    fast = StaticAdapter(model, capacity=capacity_for(70, 8, 16), buckets=(1, 4))
    eager = ModelAdapter(model)
    for adapter in (fast, eager):
        _, state = adapter.prefill(ids)
        out, state = adapter.forward(state, torch.tensor([[5, 6, 7]] * 2).cuda(), torch.tensor([[-1, 0, 0]] * 2).cuda(),
                                     torch.tensor([[70, 71, 71]] * 2).cuda())
        adapter.logits = out.logits.float()
    torch.testing.assert_close(fast.logits, eager.logits, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("padded", [False, True])
def test_the_fused_prefill_equals_hf_at_every_real_position(padded):
    model = tiny_model("qwen3")
    B, T = 2, 9
    tokens = torch.randint(1, VOCAB, (B, T), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(B, T, dtype=torch.long)
    if padded:
        mask[1, :4] = 0
    ref = model(input_ids=tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                output_hidden_states=True)
    dec = FusedDecoder(model, max_positions=32)
    cache = slot_cache(FusedDecoder.cache_shapes(model, B, 16), torch.device("cpu"))
    logits, feats = dec.prefill(tokens, mask.bool(), cache.layers, (0, 2), all_valid=not padded, last_only=False)
    real = mask.bool()[..., None]
    torch.testing.assert_close(logits * real, ref.logits * real, atol=2e-6, rtol=1e-5)
    for mine, theirs in zip(feats, (ref.hidden_states[0], ref.hidden_states[2])):
        torch.testing.assert_close(mine * real, theirs * real, atol=2e-6, rtol=1e-5)
    last, _ = dec.prefill(tokens, mask.bool(), cache.layers, all_valid=not padded)
    torch.testing.assert_close(last, ref.logits[:, -1:], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_a_prompt_shape_met_again_is_prefilled_by_its_captured_graph_with_the_same_results(device):
    from specdec.static import PREFILL_GRAPHS

    model = tiny_model("llama").to(device)
    eager = ModelAdapter(model, (0, 2))
    fast = StaticAdapter(model, (0, 2), capacity=capacity_for(12, 8, 16), buckets=(1, 4))
    g = torch.Generator().manual_seed(5)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    for call in range(3):  # eager, captured, replayed; a different prompt each time
        ids = torch.randint(1, VOCAB, (2, 12), generator=g)
        ref = _prefill_then_tree(eager, model, ids.to(device), mask.to(device))
        got = _prefill_then_tree(fast, model, ids.to(device), mask.to(device))
        assert len(fast._store.buffers.prefills) == (0 if call == 0 else 1)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    for T in range(13, 13 + PREFILL_GRAPHS + 1):  # more shapes than kept: the oldest graphs go
        ids = torch.randint(1, VOCAB, (2, T), generator=g).to(device)
        for _ in range(2):
            torch.testing.assert_close(_prefill_then_tree(fast, model, ids), _prefill_then_tree(eager, model, ids),
                                       atol=2e-5, rtol=1e-5)
    assert len(fast._store.buffers.prefills) == PREFILL_GRAPHS


def test_a_new_batch_size_keeps_the_fused_copies_and_new_weights_replace_them():
    model = tiny_model("llama")
    fast = StaticAdapter(model, capacity=64, buckets=(4,))
    eager = ModelAdapter(model)
    g = torch.Generator().manual_seed(7)
    ids1, ids3 = torch.randint(1, VOCAB, (1, 9), generator=g), torch.randint(1, VOCAB, (3, 9), generator=g)
    _prefill_then_tree(fast, model, ids1)
    decoder, buffers = fast._store.fused, fast._store.buffers
    torch.testing.assert_close(_prefill_then_tree(fast, model, ids3), _prefill_then_tree(eager, model, ids3),
                               atol=2e-5, rtol=1e-5)
    assert fast._store.buffers is not buffers and fast._store.fused is decoder  # new buffers, same fused copies
    model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(model.model.layers[0].mlp.up_proj.weight * 2)
    torch.testing.assert_close(_prefill_then_tree(fast, model, ids3), _prefill_then_tree(eager, model, ids3),
                               atol=2e-5, rtol=1e-5)
    assert fast._store.fused is not decoder
