"""The fast path (specdec/static.py): StaticAdapter against ModelAdapter, generate(fast=True) against fast=False.

CPU runs the static code eagerly; the tests marked ``gpu`` run the same checks with the bucket forwards captured as
CUDA graphs (skipped without CUDA).
"""
from __future__ import annotations

import collections
import copy
import random
import sys
import warnings

import pytest
import torch
from tiny_models import VOCAB, noisy_copy, random_forest, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from specdec import recipes
from specdec.adapter import ConsumedStateError, ModelAdapter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.generate import generate
from specdec.graphs import capture_graph, capture_graph_ref
from specdec.heads import Eagle1Head
from specdec.kernels import tree_mask_ref
from specdec.sampling import PredrawnNoise, TorchSource
from specdec.static import (
    COMPILE_CAPACITY_MULTIPLE,
    CapacityError,
    StaticAdapter,
    bucket_for,
    capacity_for,
    compiled_capture,
    held_graphs,
    static_support,
    target_adapter,
)
from specdec.step import prefill, step

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs a CUDA GPU")])
DEVICES = ["cpu", CUDA]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def _prompts(batch: int, device: str = "cpu", seed: int = 0, T: int = 10):
    """Left-padded prompts with a repeated motif (prompt lookup finds matches); row b has 2 * (b % 3) pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(batch, T, dtype=torch.long)
    mask = torch.zeros(batch, T, dtype=torch.long)
    for b in range(batch):
        n = T - (b % 3) * 2
        motif = torch.randint(1, VOCAB, (4,), generator=g)
        ids[b, T - n:] = motif.repeat(T // 4 + 1)[:n]
        mask[b, T - n:] = 1
    return ids.to(device), mask.to(device)


def _random_path(parents: list[int]) -> list[int]:
    """A root-to-node path (pending indices) through one row's forest, ending at a random present node."""
    present = [i for i, p in enumerate(parents) if i == 0 or p >= 0]
    node, path = random.Random(len(parents) + sum(parents)).choice(present), []
    while node >= 0:
        path.append(node)
        node = parents[node] if node else -1
    return path[::-1]


def _tree_inputs(state, parents: torch.Tensor, seed: int):
    g = torch.Generator().manual_seed(seed)
    B, N = parents.shape
    present = parents >= 0
    present[:, 0] = True
    tokens = torch.randint(0, VOCAB, (B, N), generator=g).to(parents.device)
    positions = tree_mask_ref(state.committed_valid, parents, present, torch.float32, lengths=state.lengths).positions
    return tokens, positions, present


def _assert_same(a, b, atol=2e-5):
    torch.testing.assert_close(a.logits, b.logits, atol=atol, rtol=1e-5)
    assert len(a.features) == len(b.features)
    for fa, fb in zip(a.features, b.features):
        torch.testing.assert_close(fa, fb, atol=atol, rtol=1e-5)


def _forward_both(eager, fast, st_e, st_f, parents, seed):
    """The same tree forward on the eager and the static adapter; asserts equal outputs, returns both states."""
    tokens, positions, present = _tree_inputs(st_e, parents, seed)
    out_e, st_e = eager.forward(st_e, tokens, parents, positions, present)
    out_f, st_f = fast.forward(st_f, tokens, parents, positions, present)
    _assert_same(out_e, out_f)
    return st_e, st_f


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "hf_modules"])
def test_tree_forwards_ragged_commits_and_decodes_equal_model_adapter(device, fused):
    model = tiny_model("llama").to(device)
    eager = ModelAdapter(model, (0, 1, 2))
    ids, mask = _prompts(3, device)
    fast = StaticAdapter(model, (0, 1, 2), capacity=capacity_for(ids.shape[1], 40, 64), fused=fused)
    assert fast.fused is fused
    out_e, st_e = eager.prefill(ids, mask)
    out_f, st_f = fast.prefill(ids, mask)
    if fused:  # the fused decoder's own prefill: equal up to summation order, at the real (non-padding) positions
        torch.testing.assert_close(out_e.logits, out_f.logits, atol=2e-5, rtol=1e-5)
        real = mask.bool()[..., None]
        for fe, ff in zip(out_e.features, out_f.features):
            torch.testing.assert_close(fe * real, ff * real, atol=2e-5, rtol=1e-5)
    else:
        _assert_same(out_e, out_f, atol=0)  # the same eager HF pass
    rng = random.Random(0)
    for k, nodes in enumerate([6, 2, 13]):  # buckets 8, 4, 16: padding in each
        parents = random_forest(rng, 3, nodes).to(device)
        st_e, st_f = _forward_both(eager, fast, st_e, st_f, parents, k)
        # Ragged accepted paths (row 1 keeps nothing: a hole across the whole width).
        paths = [_random_path(row) for row in parents.tolist()]
        paths[1] = []
        width = max(len(p) for p in paths)
        keep = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=device)
        counts = torch.tensor([len(p) for p in paths], device=device)
        st_e = eager.commit(st_e, keep, counts)
        st_f = fast.commit(st_f, keep, counts)
        assert torch.equal(st_e.committed_valid, st_f.committed_valid)
        assert torch.equal(st_e.lengths, st_f.lengths)
        for repeat in range(2):  # the first plain step rebuilds its mask row, the second only adds a column
            roots = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(10 * k + repeat))
            out_e, st_e = eager.decode(st_e, roots.to(device))
            out_f, st_f = fast.decode(st_f, roots.to(device))
            _assert_same(out_e, out_f)
            assert torch.equal(st_e.committed_valid, st_f.committed_valid)
    assert fast.captured_buckets == [1, 4, 8, 16]


def test_padding_nodes_and_buckets():
    assert [bucket_for(m, (1, 2, 4, 8)) for m in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 9]
    assert capacity_for(10, 20, 64) == 128 and capacity_for(0, 1, 62) == 64
    # A forward past the largest bucket runs eagerly at its own size and still equals ModelAdapter.
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    eager, fast = ModelAdapter(model), StaticAdapter(model, capacity=64, buckets=(1, 2))
    _, st_e = eager.prefill(ids, mask)
    _, st_f = fast.prefill(ids, mask)
    parents = random_forest(random.Random(1), 2, 4)
    tokens, positions, present = _tree_inputs(st_e, parents, 0)
    out_e, _ = eager.forward(st_e, tokens, parents, positions, present)
    out_f, _ = fast.forward(st_f, tokens, parents, positions, present)
    _assert_same(out_e, out_f)
    assert fast.captured_buckets == []


def test_a_compiled_capture_gives_the_same_steps():
    """torch.compile applied by the caller (dynamo with its eager backend here: the tracing, not the codegen)."""
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    runs = []
    for capture in (None, compiled_capture(lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=0),
                                           backend="eager")):
        adapter = StaticAdapter(model, capacity=64, capture=capture)
        out, state = adapter.prefill(ids, mask)
        roots = out.logits[:, -1].argmax(-1)
        for _ in range(3):
            out, state = adapter.decode(state, roots)
            roots = out.logits[:, -1].argmax(-1)
        runs.append(out.logits)
    torch.testing.assert_close(runs[0], runs[1])


def test_capacity_is_checked_never_wrapped():
    model = tiny_model("llama")
    ids, mask = _prompts(2, T=10)
    with pytest.raises(CapacityError, match="larger capacity"):
        StaticAdapter(model, capacity=8).prefill(ids, mask)
    fast = StaticAdapter(model, capacity=16, buckets=(1, 8))
    _, state = fast.prefill(ids, mask)
    tokens = torch.zeros(2, 7, dtype=torch.long)
    parents = torch.arange(-1, 6).expand(2, -1)
    with pytest.raises(CapacityError, match="10 committed \\+ 0 pending \\+ 8 new slots"):
        fast.forward(state, tokens, parents, state.lengths[:, None] + torch.arange(7))


def test_states_are_consumed_and_belong_to_their_adapter():
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    fast = StaticAdapter(model, capacity=64)
    _, state = fast.prefill(ids, mask)
    roots = torch.tensor([1, 2])
    fast.decode(state, roots)
    with pytest.raises(ConsumedStateError):
        fast.decode(state, roots)
    _, live = fast.prefill(ids, mask)
    _, fresh = fast.prefill(ids, mask)  # a new prompt overwrites the buffers: the older live state is spent
    with pytest.raises(ConsumedStateError, match="prefill"):
        fast.decode(live, roots)
    other = StaticAdapter(model, capacity=64)
    other.prefill(ids, mask)
    with pytest.raises(ValueError, match="other buffers"):
        other.decode(fresh, roots)


def _drafter(name, model):
    if name == "plain":
        return None
    if name == "prompt_lookup":
        return PromptLookupDrafter(max_ngram_size=3, num_drafts=5)
    if name == "draft_model_tree":
        return DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3, tree=TREE)
    torch.manual_seed(3)
    head = Eagle1Head.from_target(model).float().to(next(model.parameters()).device)
    return recipes.eagle2(head, total_tokens=10, depth=3, top_k=3)


DRAFTERS = ["plain", "prompt_lookup", "draft_model_tree", "eagle2"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_fast_path_is_token_identical_to_the_eager_path(name, batch, device):
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(batch, device)
    drafter = _drafter(name, model)
    eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24, eos_token_id=[], fast=True)
    assert torch.equal(eager.sequences, fast.sequences)
    assert eager.stats.num_target_forwards == fast.stats.num_target_forwards
    if name == "plain":  # and both are HF's greedy decoding
        hf = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                            pad_token_id=0, eos_token_id=None)
        assert torch.equal(fast.sequences, hf)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["draft_model_tree", "eagle2"])
def test_verify_forwards_read_the_committed_prefix_as_one_mask_row_and_decode_the_same(name, device, monkeypatch):
    """The static adapter passes its committed length as tree attention's prefix_end (one mask row for the
    committed slots, read where it pays: here at any width) for a state that is not dense (here every state: the
    dense path is turned off, as a state with holes has it); greedy decoding stays token-identical to the eager
    path, padding nodes included (3 rows, ragged prompts)."""
    import specdec.fused as fused

    ta = sys.modules["specdec.kernels.tree_attention"]  # the module (the package exports the function by that name)
    calls = []
    real = fused.tree_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("prefix_end"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ta, "TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS", 1)
    monkeypatch.setattr(fused, "tree_attention", spy)
    monkeypatch.setattr(StaticAdapter, "_visible", lambda self, state, size: False)
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(3, device)
    drafter = _drafter(name, model)
    eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[], fast=True)
    assert torch.equal(eager.sequences, fast.sequences)
    assert any(p is not None for p in calls)  # the fused decoder's verify forwards passed it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["draft_model_tree", "eagle2"])
def test_dense_rows_show_their_committed_slots_without_a_mask_and_decode_the_same(name, device, monkeypatch):
    """Prompts without padding, or left-padded, stay dense under late commits: the static adapter hands tree
    attention each row's end as visible_end (no mask read below it; here at any width) and its first real slot as
    kv_start (the padding not read), rows ending apart; greedy decoding stays token-identical to the eager path.
    (generate() repacks any prompt mask to the left; a state with holes passes prefix_end, see the tests around.)"""
    import specdec.fused as fused

    ta = sys.modules["specdec.kernels.tree_attention"]
    calls, starts = [], []
    real = fused.tree_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("prefix_end") is not None, kwargs.get("visible_end") is not None))
        start = kwargs.get("kv_start")
        if start is not None:  # the static buffer itself while a graph is captured (no copy to the host then)
            capturing = start.is_cuda and torch.cuda.is_current_stream_capturing()
            starts.append(start if capturing else start.tolist())
        return real(*args, **kwargs)

    monkeypatch.setattr(ta, "TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS", 1)
    monkeypatch.setattr(fused, "tree_attention", spy)
    model = tiny_model("llama", scale=3.0).to(device)
    drafter = _drafter(name, model)
    ids, mask = _prompts(3, device)
    dense_ids = ids[:, -4:].contiguous()  # every row's last 4 tokens are real: no padding
    eager = generate(model, dense_ids, drafter=drafter, max_new_tokens=16, eos_token_id=[])
    fast = generate(model, dense_ids, drafter=drafter, max_new_tokens=16, eos_token_id=[], fast=True)
    assert torch.equal(eager.sequences, fast.sequences)
    assert (False, True) in calls and (True, False) not in calls  # every verify forward read the rows' ends
    starts[:] = [s.tolist() if torch.is_tensor(s) else s for s in starts]
    assert starts and all(s == [0, 0, 0] for s in starts)
    calls.clear()
    starts.clear()
    sys.modules["specdec.static"]._STORES.pop(model, None)  # on CUDA: capture anew (held graphs replay unseen)
    eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, eos_token_id=[], fast=True)
    assert torch.equal(eager.sequences, fast.sequences)
    assert (False, True) in calls and (True, False) not in calls  # left-padded: dense from each row's start
    starts[:] = [s.tolist() if torch.is_tensor(s) else s for s in starts]
    assert starts and all(s == [0, 2, 4] for s in starts)  # row b has 2 * (b % 3) pads



def test_a_state_is_dense_until_padding_a_commit_at_lc_or_a_plain_step_after_a_late_commit():
    """StaticCacheState.dense: a prompt without padding or with left padding starts dense (each row's first real
    slot kept as its start); late commits keep it; a plain step after a late commit (rows ending before Lc keep a
    hole), an eager commit of A > 0 slots, or a prompt mask that is not left padding end it."""
    model = tiny_model("llama")
    ids, mask = _prompts(3)
    fast = StaticAdapter(model, (0, 2), capacity=capacity_for(ids.shape[1], 40, 64))
    assert fast.prefill(ids, mask)[1].dense
    assert fast._store.buffers.starts.tolist() == [0, 2, 4]
    holed = mask.clone()
    holed[0, 4] = 0  # a hole inside row 0's prompt
    assert not fast.prefill(ids, holed)[1].dense
    _, st = fast.prefill(ids[:, -4:].contiguous())
    assert st.dense
    roots = torch.tensor([1, 2, 3])
    _, st = fast.decode(st, roots)
    assert st.dense  # every row ended at Lc: the plain step writes at each row's end
    parents = torch.tensor([[-1, 0, 1]] * 3)
    tokens, positions, present = _tree_inputs(st, parents, 0)
    _, st = fast.forward(st, tokens, parents, positions, present)
    keep, counts = torch.tensor([[0, 1, 2], [0, -1, -1], [0, 1, -1]]), torch.tensor([3, 1, 2])
    st = fast.commit(st, keep, counts, late=True)
    assert st.dense and st.ends is not None
    _, st = fast.forward(st, tokens, parents, positions + 3, present)
    st = fast.commit(st, keep, counts)  # at Lc: rows keeping fewer than 3 leave holes
    assert not st.dense
    _, st = fast.prefill(ids[:, -4:].contiguous())
    _, st = fast.forward(st, tokens, parents, positions, present)
    st = fast.commit(st, keep, counts, late=True)
    _, st = fast.decode(st, roots)
    assert not st.dense  # rows 1 and 2 ended before Lc: the plain token leaves a hole before it


def test_fast_takes_false_true_graphs_or_compile_and_names_them_on_anything_else():
    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(2)
    with pytest.raises(ValueError, match="'compile'"):
        generate(model, ids, attention_mask=mask, max_new_tokens=2, fast="fastest")
    runs = [generate(model, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[], fast=fast).sequences
            for fast in (False, True, "graphs", "compile")]  # on CPU "compile" runs the static code uncompiled
    assert all(torch.equal(runs[0], r) for r in runs[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["plain", "eagle2"])
def test_the_compiled_fast_path_is_token_identical_to_the_eager_path_on_the_gpu(name):
    model = tiny_model("llama", scale=3.0).cuda()
    ids, mask = _prompts(3, "cuda")
    drafter = _drafter(name, model)
    eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24, eos_token_id=[])
    fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=24, eos_token_id=[],
                    fast="compile")
    assert torch.equal(eager.sequences, fast.sequences)
    assert eager.stats.num_target_forwards == fast.stats.num_target_forwards


@pytest.mark.parametrize("arch", ["mistral", "qwen3", "gpt_neox", "phi3"])
def test_other_architectures_run_the_static_path_with_the_same_tokens(arch):
    model = tiny_model(arch, scale=3.0)
    ids, mask = _prompts(3)
    drafter = DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3, tree=TREE)
    runs = [generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=12, eos_token_id=[], fast=fast)
            for fast in (False, True)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["plain", "draft_model_tree", "eagle2"])
def test_sampling_makes_the_same_decisions_under_the_same_noise(name, device):
    model = tiny_model("llama", scale=2.0).to(device)
    ids, mask = _prompts(3, device)
    drafter = _drafter(name, model)
    runs = []
    for fast in (False, True):
        source = TorchSource(torch.Generator(device=device).manual_seed(7))
        runs.append(generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, temperature=0.8,
                             top_p=0.95, source=source, eos_token_id=[], fast=fast))
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.tau == runs[1].stats.tau


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["plain", "draft_model_chain", "draft_model_tree", "eagle2", "lookup_fixed_width"])
def test_sampling_decides_alike_when_rows_stop_early_and_budgets_cut_the_last_steps(name, device):
    """The fast path reads a step's tokens one step late, so it may still count as active a row that an EOS has
    stopped, and it bounds budgets from below: each row's verify depth is cut on the device from the row's own
    length when sampling, so no row's draws or decisions depend on that, and both paths take the same tokens."""
    model = tiny_model("llama", scale=1.5).to(device)
    ids, mask = _prompts(3, device)
    drafter = {"draft_model_chain": lambda: DraftModelDrafter(noisy_copy(model, 0.2), num_drafts=4),
               "lookup_fixed_width": lambda: PromptLookupDrafter(max_ngram_size=3, num_drafts=4, fixed_width=True),
               }.get(name, lambda: _drafter(name, model))()
    eos = list(range(1, VOCAB, 9))  # one id in nine stops a row
    stopped = 0
    for seed in range(6):
        runs = [generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=11, temperature=1.0,
                         eos_token_id=eos, generator=torch.Generator(device=device).manual_seed(seed), fast=fast)
                for fast in (False, True)]
        assert torch.equal(runs[0].sequences, runs[1].sequences), seed
        assert torch.equal(runs[0].num_new_tokens, runs[1].num_new_tokens)
        stopped += int(((runs[0].num_new_tokens < 11) & (runs[0].num_new_tokens > 0)).sum())
    assert stopped >= 2  # rows did stop at an EOS while others went on


def test_predrawn_noise_replays_the_same_tokens_through_the_fast_path():
    model = tiny_model("llama", scale=2.0)
    ids, mask = _prompts(3)
    drafter = DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=3, mode="sample")
    g = torch.Generator().manual_seed(11)
    uniforms, exps = torch.rand(4096, generator=g), torch.empty(1 << 17).exponential_(generator=g)
    runs = [generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=12, temperature=1.0,
                     source=PredrawnNoise(uniforms, exps), eos_token_id=[], fast=fast) for fast in (False, True)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)


def test_unsupported_model_falls_back_with_one_warning_and_the_same_result():
    model = tiny_model("mistral")
    model.config.sliding_window = 256
    assert "sliding window" in static_support(model)
    assert static_support(tiny_model("llama")) is None
    dynamic_rope = tiny_model("llama")
    dynamic_rope.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    assert "dynamic RoPE" in static_support(dynamic_rope)
    ids, mask = _prompts(2)
    eager = generate(model, ids, attention_mask=mask, max_new_tokens=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = generate(model, ids, attention_mask=mask, max_new_tokens=8, fast=True)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "falls back to the eager path" in messages[0] and "sliding window" in messages[0]
    assert torch.equal(eager.sequences, fast.sequences)
    assert isinstance(target_adapter(model, (), fast=False, prompt_len=4, max_new_tokens=4), ModelAdapter)


def test_generate_sizes_the_cache_for_the_longest_run():
    model = tiny_model("llama")
    ids, mask = _prompts(1, T=30)
    adapter = target_adapter(model, (), fast=True, prompt_len=30, max_new_tokens=100)
    assert isinstance(adapter, StaticAdapter) and adapter.capacity == capacity_for(30, 100, 128) == 320
    out = generate(model, ids, attention_mask=mask, max_new_tokens=100, eos_token_id=[], fast=True,
                   drafter=DraftModelDrafter(copy.deepcopy(model), num_drafts=4))
    assert out.num_new_tokens.tolist() == [100]
    # under "compile" the cache takes 256-slot steps (a new size would recompile every compiled step)
    compiled = target_adapter(model, (), fast="compile", prompt_len=30, max_new_tokens=100)
    assert compiled.capacity == capacity_for(30, 100, 128, multiple=COMPILE_CAPACITY_MULTIPLE) == 512
    # generate(max_cache_len=) sizes it for the longest run of a session up front
    presized = target_adapter(model, (), fast=True, prompt_len=30, max_new_tokens=100, min_len=700)
    assert presized.capacity == capacity_for(700, 0, 128) == 832
    sized = generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[], fast=True,
                     max_cache_len=700)
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(sized.sequences, plain.sequences)
    for bad in (dict(max_cache_len=700), dict(max_cache_len=0, fast=True), dict(max_cache_len=7.5, fast=True)):
        with pytest.raises(ValueError, match="max_cache_len sizes the fast path"):
            generate(model, ids, attention_mask=mask, max_new_tokens=2, **bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_replayed_bucket_graph_gives_the_eager_logits():
    model = tiny_model("llama", layers=4).cuda()
    ids, mask = _prompts(3, "cuda")
    parents = random_forest(random.Random(2), 3, 20).cuda()
    outs = []
    for capture in (capture_graph, capture_graph_ref):
        fast = StaticAdapter(model, (2,), capacity=128, capture=capture)
        _, state = fast.prefill(ids, mask)
        tokens, positions, present = _tree_inputs(state, parents, 0)
        first, state2 = fast.forward(state, tokens, parents, positions, present)
        state2 = fast.commit(state2, torch.zeros(3, 1, dtype=torch.long, device="cuda"),
                             torch.ones(3, dtype=torch.long, device="cuda"))
        again, _ = fast.forward(state2, tokens, parents, positions + 1, present)  # a replay, on the moved cache
        outs.append((first, again))
    for (g, r) in zip(outs[0], outs[1]):
        _assert_same(g, r, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("drafter_name", ["plain", "draft_model_chain_sampled", "eagle2_dynamic_tree"])
def test_sampled_law_through_the_captured_fast_path_equals_the_enumerated_target_law(drafter_name):
    import test_generate_sampling as law_test

    from specdec.testing import chi_square_test

    target = copy.deepcopy(law_test.TARGET).cuda()
    torch.manual_seed(5)
    drafter = {"plain": lambda: None,
               "draft_model_chain_sampled": lambda: DraftModelDrafter(noisy_copy(target, 0.5, 1), num_drafts=3,
                                                                      mode="sample"),
               "eagle2_dynamic_tree": lambda: recipes.eagle2(Eagle1Head.from_target(target), total_tokens=8,
                                                             depth=2, top_k=3)}[drafter_name]()
    params = law_test.PARAMS["T1"]
    ids = law_test.PROMPT.expand(law_test.N, -1).contiguous().cuda()
    out = generate(target, ids, drafter=drafter, max_new_tokens=law_test.NUM_TOKENS + 2,
                   temperature=params.temperature, generator=torch.Generator(device="cuda").manual_seed(3),
                   eos_token_id=[], fast=True)
    T = ids.shape[1]
    counts = {}
    for row in map(tuple, out.sequences[:, T:T + law_test.NUM_TOKENS].tolist()):
        counts[row] = counts.get(row, 0) + 1
    fit = chi_square_test(counts, law_test._exact_law(law_test.TARGET, params))
    assert fit.p_value > law_test.ALPHA, f"{drafter_name} through the fast path: {fit}"


def _ends_arrive_late(monkeypatch) -> None:
    """Make the static adapter's copies of the rows' ends reach the host only when waited for (as a busy GPU can)."""
    import specdec.graphs as graphs
    import specdec.static as static

    def late(bound, mark, *, wait=False):
        return (bound, mark) if mark is not None and not wait else graphs.settle_bound(bound, mark, wait=wait)
    monkeypatch.setattr(static, "settle_bound", late)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["prompt_lookup", "draft_model_tree", "draft_model_chain", "eagle2"])
def test_later_calls_on_held_buffers_give_the_eager_tokens(name, batch, device, monkeypatch):
    """On CUDA generate(fast=True) keeps the target's static buffers between calls (on CPU this test holds them the
    same way, and lets the ends' copy to the host arrive late, as it does on a GPU): a later call must see nothing
    of the earlier ones. Found in session 11: slots past a row's end (a row behind the longest one, or any row while
    ``Lc`` is still the late commits' upper bound) kept the previous call's valid marks: stale keys attended."""
    import specdec.static as static

    model = tiny_model("llama", scale=3.0).to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (batch, 12), generator=g)
    mask = torch.ones(batch, 12, dtype=torch.long)
    mask[1:2, :3], mask[2:3, :6] = 0, 0  # rows of 12, 9 and 6 tokens
    ids, mask = ids.masked_fill(mask == 0, 0).to(device), mask.to(device)
    if device == "cpu":  # hold one store per feature layers, as target_adapter does on CUDA
        stores, make = {}, static.target_adapter
        _ends_arrive_late(monkeypatch)

        def held(model, feature_layers, **kw):
            adapter = make(model, feature_layers, **kw)
            if isinstance(adapter, StaticAdapter):
                adapter._store = stores.setdefault(tuple(feature_layers), adapter._store)
            return adapter
        monkeypatch.setattr(sys.modules["specdec.generate"], "target_adapter", held)
    drafter = (DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=4) if name == "draft_model_chain"
               else _drafter(name, model))
    eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=20, eos_token_id=[])
    plain = generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(eager.sequences, plain.sequences)
    for _ in range(3):  # plain first (its own buffers), then the drafter's calls on the same held buffers
        fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=20, eos_token_id=[],
                        fast=True)
        assert torch.equal(fast.sequences, eager.sequences)
        assert fast.stats.num_target_forwards == eager.stats.num_target_forwards


def test_a_late_bound_whose_copy_lags_never_fills_the_cache(monkeypatch):
    """Late commits let Lc run ahead of the rows' ends until a copy of the ends reaches the host. If that copy lags
    (as it can on a GPU) the bound grows by each step's width; when a bucket no longer fits under it, the step must
    read the true ends (one sync), not raise CapacityError for a cache the run fits in (found in session 11)."""
    _ends_arrive_late(monkeypatch)
    model = tiny_model("llama", scale=3.0)
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    drafter = DraftModelDrafter(noisy_copy(model, 0.3), num_drafts=6)
    plain = generate(model, ids, max_new_tokens=120, eos_token_id=[])
    fast = generate(model, ids, drafter=drafter, max_new_tokens=120, eos_token_id=[], fast=True)
    assert torch.equal(fast.sequences, plain.sequences) and fast.stats.tau > 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_generate_reuses_the_captured_graphs_and_never_keeps_the_model_alive():
    import gc
    import weakref

    model = tiny_model("llama").cuda()
    ids, mask = _prompts(2, "cuda")
    first = target_adapter(model, (), fast=True, prompt_len=ids.shape[1], max_new_tokens=8)
    generate(model, ids, attention_mask=mask, max_new_tokens=8, fast=True)
    second = target_adapter(model, (), fast=True, prompt_len=ids.shape[1], max_new_tokens=8)
    assert first is not second and first._store is second._store and second.captured_buckets == [1]
    alive = weakref.ref(model)
    del model, first, second
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("name", ["eagle2"])  # graphable, not a frozen configuration (SpS graphs its own adapter)
def test_the_graphed_wrapper_is_kept_per_drafter_and_never_keeps_it_alive(name):
    """fast_drafter hands the same wrapper to every call with one drafter (its graphs replay in the next call), a
    deep copy of the drafter gets its own, and the drafter is freed once the caller drops it (session 37: a weak table
    whose values held their keys kept every drafter, its head and its graphs, for the life of the process)."""
    import gc
    import weakref

    from specdec.static import fast_drafter

    drafter = _drafter(name, tiny_model("llama"))
    drafter = getattr(drafter, "drafter", drafter)  # a recipe's GraphedDrafter: its inner drafter
    wrapper = fast_drafter(drafter)
    assert wrapper is not drafter and fast_drafter(drafter) is wrapper
    assert fast_drafter(copy.deepcopy(drafter)) is not wrapper
    shallow = copy.copy(drafter)  # shares the original's attribute dict entries: still gets its own wrapper
    assert fast_drafter(shallow) is not wrapper and fast_drafter(drafter) is wrapper
    del shallow
    alive = weakref.ref(drafter)
    del drafter, wrapper
    gc.collect()
    assert alive() is None


def test_an_adapter_counts_its_builds_and_captures():
    """StaticAdapter.counts: one build for the first prefill; a capture per new bucket or plain step, none on a
    replay; a compiled capture's uncompiled inner capture is counted as well (the committing steps use it)."""
    model = tiny_model("llama")
    ids, mask = _prompts(2)
    for capture in (None, compiled_capture(lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=0),
                                           backend="eager")):
        adapter = StaticAdapter(model, capacity=64, capture=capture)
        assert adapter.counts == {"builds": 0, "captures": 0}
        out, state = adapter.prefill(ids, mask)
        assert adapter.counts["builds"] == 1
        roots = out.logits[:, -1].argmax(-1)
        out, state = adapter.decode(state, roots)
        after_one = adapter.counts["captures"]
        assert after_one >= 1
        for _ in range(3):  # the same plain step again: replays only
            out, state = adapter.decode(state, out.logits[:, -1].argmax(-1))
        assert adapter.counts == {"builds": 1, "captures": after_one}
        assert adapter._capture_fn() is adapter._capture_fn()  # made once: the forwards ask for it every step
        tokens = torch.zeros(2, 3, dtype=torch.long)
        parents = torch.tensor([[-1, 0, 1]] * 2)
        _, state = adapter.forward(state, tokens, parents, state.lengths[:, None] + torch.arange(3))
        assert adapter.counts["captures"] == after_one + 1  # a tree of 3 nodes: a new bucket


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_held_graphs_reports_the_stores_generate_keeps():
    model = tiny_model("llama").cuda()
    ids, mask = _prompts(2, "cuda")
    assert held_graphs(model) == {}
    generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], fast=True)
    (key, first), = held_graphs(model).items()
    assert key[0] == () and first["builds"] == 1 and first["captures"] >= 1 and first["graphs"] >= 1
    assert first["batch"] == 2 and first["capacity"] >= ids.shape[1] + 8
    generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], fast=True)
    second = held_graphs(model)[key]  # the prefill's shape met twice: captured now
    generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], fast=True)
    assert held_graphs(model)[key] == second and second["builds"] == 1  # the third call captures nothing
    from specdec.static import release_graphs

    assert release_graphs(model) == 1 and held_graphs(model) == {}
    generate(model, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[], fast=True)
    assert held_graphs(model)[key]["builds"] == 1  # a new store: built anew


def test_equal_frozen_drafters_share_a_wrapper_and_only_the_last_few_are_kept(monkeypatch):
    """A prompt lookup written inline in every call (a new but equal configuration each time) replays the last call's
    graphs; another configuration gets its own wrapper; only SHARED_DRAFTERS configurations are kept."""
    import specdec.static as static

    monkeypatch.setattr(static, "_SHARED", collections.OrderedDict())
    monkeypatch.setattr(static, "SHARED_DRAFTERS", 2)
    first = static.fast_drafter(PromptLookupDrafter(max_ngram_size=3, num_drafts=5))
    assert static.fast_drafter(PromptLookupDrafter(max_ngram_size=3, num_drafts=5)) is first
    other = static.fast_drafter(PromptLookupDrafter(max_ngram_size=2, num_drafts=5))
    assert other is not first
    assert static.graphed_wrappers(PromptLookupDrafter(max_ngram_size=3, num_drafts=5)) == [first]
    static.fast_drafter(PromptLookupDrafter(max_ngram_size=4, num_drafts=5))  # a third: the oldest (first) goes
    assert static.graphed_wrappers(PromptLookupDrafter(max_ngram_size=3, num_drafts=5)) == []
    assert static.graphed_wrappers(PromptLookupDrafter(max_ngram_size=2, num_drafts=5)) == [other]


def test_release_graphs_lets_go_of_a_drafters_wrappers_and_ignores_anything_else(monkeypatch):
    import specdec.static as static
    from specdec.static import fast_drafter, graphed_wrappers, release_graphs

    monkeypatch.setattr(static, "_SHARED", collections.OrderedDict())  # equal lookups of other tests share theirs

    drafter = PromptLookupDrafter(max_ngram_size=3, num_drafts=5)
    wrapper = fast_drafter(drafter)
    assert graphed_wrappers(drafter) == [wrapper]
    assert release_graphs(drafter, None, 3, "text") == 1 and graphed_wrappers(drafter) == []
    assert fast_drafter(drafter) is not wrapper  # wrapped anew
    assert release_graphs(tiny_model("llama")) == 0  # a model the fast path never kept anything for


@pytest.mark.parametrize("device", DEVICES)
def test_plain_steps_keep_the_mask_row_a_full_rebuild_would_give(device):
    """The plain step's mask row, updated one column per step, equals tree_mask_ref's row built from scratch."""
    model = tiny_model("llama").to(device)
    ids, mask = _prompts(3, device)
    fast = StaticAdapter(model, capacity=capacity_for(ids.shape[1], 16, 64))
    _, state = fast.prefill(ids, mask)
    rng = random.Random(1)
    for k, plain_steps in enumerate([3, 2]):
        for _ in range(plain_steps):
            Lc = state.committed
            before = state.committed_valid.clone()
            _, state = fast.decode(state, torch.full((3,), 5 + k, device=device))
            row = fast._store.buffers.plain.runner.inputs[2]
            root = torch.full((3, 1), -1, device=device)
            want = tree_mask_ref(before, root, root < 0, torch.float32).mask[..., :Lc + 1]
            assert torch.equal(row[..., :Lc + 1], want)
            assert bool((row[..., Lc + 1:] == torch.finfo(torch.float32).min).all())
        parents = random_forest(rng, 3, 5).to(device)  # then a tree step with ragged commits: holes in the slots
        tokens, positions, present = _tree_inputs(state, parents, k)
        _, state = fast.forward(state, tokens, parents, positions, present)
        paths = [_random_path(row) for row in parents.tolist()]
        width = max(len(p) for p in paths)
        keep = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=device)
        state = fast.commit(state, keep, torch.tensor([len(p) for p in paths], device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_plain_and_tree_steps_interleaved_emit_the_eager_tokens(device):
    model = tiny_model("llama", scale=3.0).to(device)
    ids, mask = _prompts(3, device)
    drafter = _drafter("eagle2", model)
    eager, fast = ModelAdapter(model, drafter.feature_layers), StaticAdapter(
        model, drafter.feature_layers, capacity=capacity_for(ids.shape[1], 40, 64))
    out_e = prefill(eager, ids, mask, drafter=drafter)
    out_f = prefill(fast, ids, mask, drafter=drafter)
    for k in [0, 0, 3, 0, 0, 0, 2, 3, 0, 1, 0]:
        out_e = step(eager, out_e.state, drafter=drafter, num_drafts=k)
        out_f = step(fast, out_f.state, drafter=drafter, num_drafts=k)
        assert out_e.emitted == out_f.emitted
        assert torch.equal(out_e.state.cache.lengths, out_f.state.cache.lengths)
    if device == "cuda":  # the plain step's forward was captured as a graph and replayed
        assert fast._store.buffers.plain.runner is not None


class _CountOutsideCaptures(TorchDispatchMode):
    """Counts aten ops dispatched outside the captured target forwards (what runs eagerly on a CUDA host)."""

    def __init__(self):
        super().__init__()
        self.ops, self.inside = collections.Counter(), 0

    def _flagged(self, fn):
        def flagged(*args):
            self.inside += 1
            try:
                return fn(*args)
            finally:
                self.inside -= 1
        return flagged

    def capture(self, fn, inputs):
        captured = capture_graph_ref(fn, inputs, warmup=0)
        captured._run = self._flagged(captured._run)  # the reference's output copies are a replay's work too
        return captured

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_fast_plain_step_runs_only_a_few_aten_ops_outside_its_captured_forward(batch):
    model = tiny_model("llama")
    counter = _CountOutsideCaptures()
    ids, mask = _prompts(batch)
    adapter = StaticAdapter(model, capacity=capacity_for(ids.shape[1], 8, 64), capture=counter.capture)
    out = step(adapter, step(adapter, prefill(adapter, ids, mask).state).state)  # captured, mask row built
    with counter:
        step(adapter, out.state)
    # The root and its position copied into the captured inputs, the write slot filled, the logits and the argmax
    # cloned out of the graph, lengths + 1. The mask column, the valid slot and the argmax run inside the graph;
    # no tree mask, no cat, no allocation. (Before issue 13's changes: 24 ops and a tree_mask launch.)
    assert sum(counter.ops.values()) <= 6, counter.ops
    assert not {"aten.argmax", "aten.cat", "aten.full", "aten.arange"} & set(counter.ops), counter.ops


@pytest.mark.parametrize("name", ["eagle2"])
def test_compiled_drafter_steps_give_the_same_tokens(name):
    """generate(fast="compile") compiles the drafter's captured steps too: traced by dynamo (eager backend) here."""
    from specdec.graphs import GraphedDrafter

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(2)
    drafter = _drafter(name, model)
    drafter = drafter.drafter if isinstance(drafter, GraphedDrafter) else drafter  # recipes return graphed drafters
    traced = GraphedDrafter(drafter, capture=compiled_capture(
        lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=0), backend="eager"), device_types=("cpu",))
    runs = [generate(model, ids, attention_mask=mask, drafter=d, max_new_tokens=12, eos_token_id=[], fast=True)
            for d in (drafter, traced)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.num_target_forwards == runs[1].stats.num_target_forwards
    assert traced.in_place_keys == [] and traced.counts["in_place"] == 0  # no variant compiled for a few copies


def test_kernels_dispatch_to_their_references_inside_torch_compile(monkeypatch):
    from specdec.kernels import _dispatch

    monkeypatch.setattr(_dispatch, "triton_available", lambda: True)
    cuda_like = type("T", (), {"is_cuda": True})()
    assert _dispatch.use_kernel("tree_mask", cuda_like)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _dispatch.use_kernel("tree_mask", cuda_like)


def test_near_the_budget_the_drafter_keeps_its_k_and_the_step_verifies_less():
    """The last steps of a row draft the schedule's K (one captured propose shape) and verify only what fits."""
    from specdec.graphs import GraphedDrafter

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(2)
    drafter = _drafter("eagle2", model)
    inner = drafter.drafter if isinstance(drafter, GraphedDrafter) else drafter
    graphed = GraphedDrafter(inner, capture=lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=0),
                             device_types=("cpu",))
    for n in (5, 11):
        out = generate(model, ids, attention_mask=mask, drafter=graphed, max_new_tokens=n, eos_token_id=[], fast=True)
        assert out.num_new_tokens.tolist() == [n, n]
        eager = generate(model, ids, attention_mask=mask, drafter=inner, max_new_tokens=n, eos_token_id=[])
        assert torch.equal(out.sequences, eager.sequences)
    assert [key for key in graphed.graph_keys if key[0] == "propose"] == [("propose", 3)]


# ---------------------------------------------------------------- steps with drafts and no host sync (late commits)
@pytest.mark.parametrize("device", DEVICES)
def test_late_commits_keep_rows_dense_and_give_the_eager_forwards(device):
    """StaticAdapter.commit(late=True): each row's path moves to the row's own end (no counts on the host); the
    forwards that follow see what the eager adapter's see, and Lc comes back down to the longest row."""
    model = tiny_model("llama").to(device)
    eager = ModelAdapter(model, (0, 2))
    ids, mask = _prompts(3, device)
    fast = StaticAdapter(model, (0, 2), capacity=capacity_for(ids.shape[1], 60, 64))
    _, st_e = eager.prefill(ids, mask)
    _, st_f = fast.prefill(ids, mask)
    rng = random.Random(3)
    for k, nodes in enumerate([6, 9, 4, 13, 7]):
        parents = random_forest(rng, 3, nodes).to(device)
        st_e, st_f = _forward_both(eager, fast, st_e, st_f, parents, k)
        paths = [_random_path(row) for row in parents.tolist()]
        paths[k % 3] = paths[k % 3][:1]  # one row keeps only its root
        width = max(len(p) for p in paths)
        counts = torch.tensor([len(p) for p in paths], device=device)
        keep = torch.tensor([p + [-1] * (width - len(p)) for p in paths], device=device)
        st_e = eager.commit(st_e, keep, counts)
        wide = torch.cat([keep, torch.full((3, 2), -1, device=device)], 1)  # the late caller passes K + 1 columns
        before = st_f.committed
        st_f = fast.commit(st_f, wide, counts, late=True)
        assert st_f.committed == before + width + 2  # an upper bound...
        ends = st_f.ends.tolist()
        valid = st_f.valid
        for b in range(3):  # ...each row's tokens end at its own end (holes only where a plain step wrote at Lc)
            assert int(valid[b].sum()) == int(st_f.lengths[b]) and not valid[b, ends[b]:].any()
            if k == 0:  # no plain step yet: dense from the first real token
                assert valid[b, int(valid[b].nonzero()[0]):ends[b]].all()
        assert torch.equal(st_e.lengths, st_f.lengths)
        assert StaticAdapter._tightened(st_f, 1).committed == max(ends)  # ...lowered again (CPU: at once)
        if k % 2:  # a plain step between tree steps
            roots = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(k)).to(device)
            out_e, st_e = eager.decode(st_e, roots)
            out_f, st_f = fast.decode(st_f, roots)
            _assert_same(out_e, out_f)
            assert st_f.ends is None and st_f.committed == max(ends) + 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_captured_forward_and_commit_equals_forward_then_a_late_commit(device):
    """StaticAdapter.forward_commit (forward, the caller's decision and the late commit as one captured step, Lc
    read on the device) leaves the cache as forward() + commit(late=True) do, over replays at growing Lc, a plain
    step between, and a tree wider than every bucket (run eagerly); the capture's warm-up runs change nothing. The
    step builds its mask on the device (given ``present``, or ``present=None``: the root and the nodes with a
    parent) and hands ``decide`` the parents it was given."""
    model = tiny_model("llama").to(device)
    ids, mask = _prompts(3, device)
    capture = None if device == "cuda" else (lambda fn, inputs: capture_graph_ref(fn, inputs, warmup=2))
    ref = StaticAdapter(model, (0, 2), capacity=capacity_for(ids.shape[1], 90, 64), buckets=(1, 8, 16))
    cap = StaticAdapter(model, (0, 2), capacity=capacity_for(ids.shape[1], 90, 64), buckets=(1, 8, 16),
                        capture=capture)
    _, st_r = ref.prefill(ids, mask)
    _, st_c = cap.prefill(ids, mask)

    def decide(logits, features, tokens, positions, parents, keep, counts):  # the kept paths come in as inputs
        return keep, counts, (logits * 1, tuple(f * 1 for f in features), tokens * 1, positions * 1, parents * 1)

    rng = random.Random(5)
    for k, nodes in enumerate([6, 7, 6, 13, 20, 6]):
        parents = random_forest(rng, 3, nodes).to(device)
        tokens, positions, present = _tree_inputs(st_r, parents, k)
        derived = k % 2 == 1  # present=None: the step finds the tree convention (_tree_inputs') from the parents
        if not derived and k:
            present[k % 3, -1] = False  # a given present that is not the convention: honoured as given
        paths = [_random_path(row) for row in parents.tolist()]
        paths[k % 3] = paths[k % 3][:1]
        counts = torch.tensor([len(p) for p in paths], device=device)
        keep = torch.tensor([p + [-1] * (4 - len(p)) if len(p) <= 4 else p[:4] for p in paths], device=device)
        counts = counts.clamp(max=4)
        out_r, st_r = ref.forward(st_r, tokens, parents, positions, present)
        st_r = ref.commit(st_r, keep, counts, late=True)
        (logits, feats, seen_tokens, seen_positions, seen_parents), st_c = cap.forward_commit(
            st_c, tokens, parents, positions, None if derived else present, decide, (keep, counts), "given")
        assert torch.equal(seen_parents, parents)
        torch.testing.assert_close(logits, out_r.logits, atol=2e-5, rtol=1e-5)
        for a, b in zip(feats, out_r.features):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
        assert torch.equal(seen_tokens, tokens) and torch.equal(seen_positions, positions)
        assert st_c.committed == st_r.committed and torch.equal(st_c.lengths, st_r.lengths)
        assert torch.equal(st_c.ends, st_r.ends) and torch.equal(st_c.valid, st_r.valid)
        if k == 2:  # a plain step between: the same token logits from both caches
            roots = torch.randint(0, VOCAB, (3,), generator=torch.Generator().manual_seed(k)).to(device)
            out_r, st_r = ref.decode(st_r, roots)
            out_c, st_c = cap.decode(st_c, roots)
            _assert_same(out_r, out_c)
    # the next forwards see the same cache
    parents = random_forest(rng, 3, 5).to(device)
    _forward_both(ref, cap, st_r, st_c, parents, 99)
    assert [key[:3] + key[-1:] for key in cap._store.buffers.runners if isinstance(key, tuple)] == [
        ("commit", 8, 7, False), ("commit", 8, 8, True), ("commit", 16, 14, True), ("commit", 8, 7, True)
    ]  # root + nodes, present given (even k) or found (odd k); 21 > every bucket: eagerly
    with pytest.raises(ValueError, match="no pending slots"):
        _, pending = cap.forward(cap.prefill(ids, mask)[1], tokens[:, :2], parents[:, :2], positions[:, :2])
        cap.forward_commit(pending, tokens, parents, positions, present, decide, (keep, counts), "given")


@pytest.mark.parametrize("name", ["eagle2", "draft_model_tree", "prompt_lookup"])
def test_steps_with_drafts_and_sync_false_hand_over_late_tokens_equal_to_the_eager_ones(name):
    from specdec.step import LateTokens

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(3)
    drafter = _drafter(name, model)
    eager, fast = ModelAdapter(model, drafter.feature_layers), StaticAdapter(
        model, drafter.feature_layers, capacity=capacity_for(ids.shape[1], 60, 64))
    out_e = prefill(eager, ids, mask, drafter=drafter)
    out_f = prefill(fast, ids, mask, drafter=drafter)
    for k in [3, 3, 0, 2, 3, 3, 0, 0, 1, 3]:
        out_e = step(eager, out_e.state, drafter=drafter, num_drafts=k)
        out_f = step(fast, out_f.state, drafter=drafter, num_drafts=k, sync=False)
        assert isinstance(out_f.emitted, LateTokens)
        assert out_f.emitted.wait() == out_e.emitted
        assert torch.equal(out_e.state.cache.lengths, out_f.state.cache.lengths)
        assert torch.equal(out_e.state.roots, out_f.state.roots)


def test_a_bad_draft_id_on_a_late_step_is_raised_when_its_tokens_are_read():
    """generate(fast=True) runs steps with drafts without a sync; a drafter's id outside the vocabulary is still a
    named error (read with the tokens, one step later), never an index error or a silent clamp."""
    from specdec.types import Draft, DraftScheme

    class Bad(PromptLookupDrafter):
        def propose(self, state, request):  # a two-node chain per row; row 1's second node is out of vocabulary
            _, state = super().propose(state, request)
            B = request.roots.shape[0]
            tokens = torch.full((B, 2), 5)
            tokens[1, 1] = VOCAB + 5
            return Draft(tokens=tokens, parents=torch.tensor([[-1, 0, 1]] * B), depths=torch.tensor([[0, 1, 2]] * B),
                         draft_probs=None, scheme=DraftScheme.DETERMINISTIC), state

    model = tiny_model("llama")
    ids, mask = _prompts(3)
    with pytest.raises(ValueError, match=r"Bad proposed a token id outside the target's vocabulary at row 1, node 2"):
        generate(model, ids, attention_mask=mask, drafter=Bad(num_drafts=3, fixed_width=True), max_new_tokens=12,
                 eos_token_id=[], fast=True)


@pytest.mark.parametrize("name", ["draft_model_tree", "eagle2"])
def test_late_steps_stop_rows_at_eos_and_stop_strings_as_the_eager_path(name):
    """Steps with drafts hand their tokens over late on the fast path: an EOS or a stop string is learnt one step
    late, and what that row got afterwards is dropped, so the outputs equal the eager path's."""
    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(3)
    drafter = _drafter(name, model)
    free = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=30, eos_token_id=[])
    T = ids.shape[1]
    # EOS ids that each row emits at different places (the third and ninth new token of row 0, the fifth of row 1)
    eos = sorted({int(free.sequences[0, T + 2]), int(free.sequences[1, T + 4])})

    class Decode:  # a "tokenizer" whose text is the ids joined: the stop string is row 2's tokens 5-6
        def decode(self, tokens, skip_special_tokens=False):
            return " ".join(map(str, tokens)) + " "

    stop = f"{int(free.sequences[2, T + 5])} {int(free.sequences[2, T + 6])} "
    for kwargs in (dict(eos_token_id=eos), dict(eos_token_id=[], stop_strings=stop, tokenizer=Decode())):
        eager = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=30, **kwargs)
        fast = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=30, fast=True, **kwargs)
        assert torch.equal(eager.sequences, fast.sequences) and torch.equal(eager.num_new_tokens, fast.num_new_tokens)
        assert (fast.num_new_tokens < 30).any()  # some row did stop early


@pytest.mark.parametrize("kind", ["draft_model", "peagle"])
@pytest.mark.parametrize("fast", [False, True])
def test_a_fast_run_ends_on_the_shape_of_its_speculative_steps(fast, kind, monkeypatch):
    """A step whose budget leaves no room for a draft (one token left) is a plain step on the eager path, but on the
    greedy fast path it keeps the speculative step's shape (every draft node absent), so that the first run to end so
    captures nothing new (session 19: a plain forward and the drafter's plain update captured inside a timed call
    cost ~0.5 s on the H200). Same tokens and forwards either way."""
    import specdec.step as step_module

    model = tiny_model("llama", scale=3.0)
    ids, mask = _prompts(1)
    if kind == "draft_model":  # drafts mostly rejected: 1-2 tokens per step
        drafter = DraftModelDrafter(noisy_copy(model, 3.0), num_drafts=4)
    else:  # an untrained P-EAGLE head, graphed on the CPU as on CUDA (capture_graph_ref)
        from specdec.graphs import GraphedDrafter
        from specdec.heads import PEagleHead

        torch.manual_seed(0)
        head = PEagleHead.from_target(model, num_layers=1, max_drafts=4)
        drafter = GraphedDrafter(recipes.peagle(head, cuda_graphs=False), capture=capture_graph_ref,
                                 device_types=("cpu",))
    plain_steps, plain = [], step_module._plain

    def counted(*args, **kwargs):
        plain_steps.append(1)
        return plain(*args, **kwargs)
    monkeypatch.setattr(step_module, "_plain", counted)
    out = generate(model, ids, attention_mask=mask, drafter=drafter, max_new_tokens=9, eos_token_id=[], fast=fast)
    monkeypatch.setattr(step_module, "_plain", plain)
    ref = generate(model, ids, attention_mask=mask, max_new_tokens=9, eos_token_id=[])
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.num_target_forwards == generate(model, ids, attention_mask=mask, drafter=drafter,
                                                     max_new_tokens=9, eos_token_id=[],
                                                     fast=not fast).stats.num_target_forwards
    assert (len(plain_steps) == 0) if fast else (len(plain_steps) >= 1), plain_steps
