"""CUDA-only checks (skipped without a GPU): CUDA graphs (specdec/graphs.py) around the EAGLE drafter, the
capture against its eager reference, and the CUDA attention backends.

Run on the GPU machine with ``python -m pytest -q tests/test_gpu.py``.
"""
from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, noisy_copy, tiny_model

import specdec as sd
from specdec.drafters import EagleDrafter
from specdec.fused import decode_kernels
from specdec.graphs import capture_graph, capture_graph_ref, cuda_graphed
from specdec.heads import Eagle1Head, Eagle3Head
from specdec.nn import masked_attention
from specdec.trees import EAGLE_MC_SIM_7B_63, DynamicTree, StaticTree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4, scale=4.0).cuda()


def _prompts(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, 12), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :5] = 0  # left padding on the second row
    return ids.cuda(), mask.cuda()


def _heads(target):
    torch.manual_seed(0)
    return {"eagle1": Eagle1Head.from_target(target).float(),
            "eagle3": Eagle3Head.from_target(target, feature_layers=(1, 2, 4)).float()}


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
@pytest.mark.parametrize("policy", ["dynamic", "static"])
def test_cuda_graph_drafts_equal_eager_drafts(target, kind, policy):
    head = _heads(target)[kind]

    def make():
        tree = DynamicTree(total_tokens=16, depth=4, top_k=3) if policy == "dynamic" else StaticTree(
            EAGLE_MC_SIM_7B_63)
        return EagleDrafter(head, tree)

    graphed, eager = cuda_graphed(make()), make()
    plain = None
    for seed in range(2):  # the second call reuses the graphed drafter's buffer and graphs
        ids, mask = _prompts(2, seed)
        a = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=24)
        b = sd.generate(target, ids, attention_mask=mask, drafter=eager, max_new_tokens=24)
        plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=24)
        assert any(key[0] == "propose" for key in graphed.graph_keys), "the draft step was never captured"
        assert ("update",) in graphed.graph_keys, "the update step was never captured"
        if seed == 0:
            cache = graphed.buffers
        assert graphed.buffers is cache  # start() handed the same cache out again
        assert torch.equal(a.sequences, b.sequences)
        assert a.stats.num_accepted_per_step == b.stats.num_accepted_per_step
        assert torch.equal(a.sequences, plain.sequences)


def test_cuda_graphs_survive_a_cache_reallocation(target):
    drafter = cuda_graphed(EagleDrafter(_heads(target)["eagle1"], DynamicTree(total_tokens=8, depth=3, top_k=2)))
    ids, mask = _prompts(1)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=300 - ids.shape[1])
    ref = sd.generate(target, ids, attention_mask=mask, max_new_tokens=300 - ids.shape[1])
    assert torch.equal(out.sequences, ref.sequences)
    assert drafter.buffers.capacity >= 300  # the cache grew and the graphs were captured again on it


@pytest.mark.parametrize("make", ["draft_model", "prompt_lookup", "eagle2"])
def test_greedy_identity_on_cuda(target, make):
    drafter = {
        "draft_model": lambda: sd.DraftModelDrafter(noisy_copy(target, 0.3), num_drafts=4),
        "prompt_lookup": lambda: sd.PromptLookupDrafter(num_drafts=4),
        "eagle2": lambda: sd.recipes.eagle2(_heads(target)["eagle1"], total_tokens=16, depth=4, top_k=3),
    }[make]()
    ids, mask = _prompts(2)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=32)
    ref = sd.generate(target, ids, attention_mask=mask, max_new_tokens=32)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.tau >= 1.0


def test_sampled_tree_at_temperature_runs_eagerly(target):
    from specdec.trees import SampledTree

    drafter = cuda_graphed(EagleDrafter(_heads(target)["eagle1"], SampledTree([(0,), (1,), (0, 0)])))
    ids, mask = _prompts(2)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, temperature=1.0,
                      generator=torch.Generator(device="cuda").manual_seed(0))
    assert out.sequences.shape[1] == ids.shape[1] + 16
    # T > 0 with a sampled tree: its draft runs eagerly (random draws are not graph-captured); the update,
    # which draws nothing, may still be graphed
    assert not [key for key in drafter.graph_keys if key[0] == "propose"]


def test_capture_graph_equals_its_eager_reference():
    g = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(16, 16, device="cuda", generator=g)
    mask = torch.rand(2, 1, 5, 5, device="cuda", generator=g) < 0.5
    mask |= torch.eye(5, dtype=torch.bool, device="cuda")

    def fn(q, k):
        return masked_attention(q @ weight, k, k, mask), q.sum(-1)

    inputs = (torch.randn(2, 4, 5, 16, device="cuda", generator=g),
              torch.randn(2, 2, 5, 16, device="cuda", generator=g))
    graphed, ref = capture_graph(fn, inputs), capture_graph_ref(fn, inputs)
    for _ in range(3):  # replays after new inputs are copied in
        new = tuple(torch.randn(x.shape, device="cuda", generator=g) for x in inputs)
        a, b = graphed(*new), ref(*new)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a, fn(*new), rtol=1e-5, atol=1e-5)


def test_a_graph_keeps_the_tensors_its_function_closes_over_alive():
    """Session 37's fast-path defect: a step closing over a constant made before its capture (and referenced by
    nothing else) must not read freed memory at its replays. The constant's block is the next one handed out for its
    size on this stream, so without the hold the sentinels below land where the graph reads."""
    import gc
    import weakref

    def make_step():
        first = torch.arange(8, device="cuda")[None, :] == 0  # referenced by the closure alone

        def fn(parents):
            return (parents >= 0) | first
        return fn, weakref.ref(first)

    fn, alive = make_step()
    parents = torch.full((2, 8), -1, device="cuda")
    step = capture_graph(fn, (parents,))
    del fn
    gc.collect()
    assert alive() is not None  # held by the captured step
    sentinels = [torch.ones(1, 8, dtype=torch.bool, device="cuda") for _ in range(64)]  # noqa: F841 (reuse bait)
    want = torch.zeros(2, 8, dtype=torch.bool, device="cuda")
    want[:, 0] = True
    for _ in range(3):
        assert torch.equal(step(parents), want)
    del step
    gc.collect()
    assert alive() is None  # and let go with it


@pytest.mark.parametrize("blas", ["cublaslt", "cublas"])
def test_capture_graph_captures_under_its_blas_library_and_restores_the_process_preference(blas):
    """The warm-up and the capture run with torch preferring capture_blas()'s library; the process's own
    preference is back afterwards (also when the step raises), and the replay equals the eager product."""
    seen = []

    def fn(x, w):
        seen.append(torch.backends.cuda.preferred_blas_library())
        return torch.nn.functional.linear(x, w)

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(61, 256, device="cuda", generator=g)
    w = torch.randn(512, 256, device="cuda", generator=g)
    before = torch.backends.cuda.preferred_blas_library()
    with decode_kernels(blas=blas):
        step = capture_graph(fn, (x, w))
    assert torch.backends.cuda.preferred_blas_library() == before
    want = {"cublaslt": torch._C._BlasBackend.Cublaslt, "cublas": torch._C._BlasBackend.Cublas}[blas]
    assert seen and all(b == want for b in seen)
    torch.testing.assert_close(step(x, w), x @ w.T, rtol=1e-4, atol=1e-4)

    def bad(x, w):
        raise RuntimeError("no capture")
    with pytest.raises(RuntimeError, match="no capture"):
        capture_graph(bad, (x, w))
    assert torch.backends.cuda.preferred_blas_library() == before


def test_a_collection_during_a_capture_frees_no_dead_graph():
    """Session 42's CUDA fuzz: a dead CUDA graph held in a reference cycle (a dropped drafter's, say), freed by a
    collection that started inside another capture, was reset under capture, which invalidated that capture. The
    collector now waits until the capture is over."""
    import gc

    spare = torch.cuda.CUDAGraph()
    buf = torch.zeros(8, device="cuda")
    with torch.cuda.graph(spare):
        buf.add_(1)
    spares, freed = [spare], []
    del spare

    class Cycle:  # garbage as soon as made: only a collection frees it (and the graph it holds)
        def __init__(self, graph):
            self.graph, self.me = graph, self

        def __del__(self):
            freed.append(torch.cuda.is_current_stream_capturing())

    def fn(x):
        if torch.cuda.is_current_stream_capturing() and spares:
            Cycle(spares.pop())
            [[i] for i in range(1000)]  # container allocations past the collector's first threshold
        return x * 2

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1)
    try:
        step = capture_graph(fn, (torch.ones(4, device="cuda"),))
    finally:
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()
    gc.collect()
    assert freed == [False]  # freed, after the capture
    assert gc.isenabled() == enabled
    torch.testing.assert_close(step(torch.full((4,), 3.0, device="cuda")), torch.full((4,), 6.0, device="cuda"))
