"""CUDA-only checks (skipped without a GPU): the CUDA-graph draft path and the CUDA attention backends.

Run on the GPU machine with ``python -m pytest -q tests/test_gpu.py``.
"""
from __future__ import annotations

import pytest
import torch

import specdec as sd
from specdec.trees import DynamicTree, StaticTree
from specdec.heads import Eagle1Head, Eagle3Head
from specdec.drafters import EagleDrafter
from specdec.trees import EAGLE_MC_SIM_7B_63

from tiny_models import VOCAB, noisy_copy, tiny_model

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

    def make(graphs):
        tree = DynamicTree(total_tokens=16, depth=4, top_k=3) if policy == "dynamic" else StaticTree(
            EAGLE_MC_SIM_7B_63)
        return EagleDrafter(head, tree, cuda_graphs=graphs)

    graphed, eager = make(True), make(False)
    plain = None
    for seed in range(2):  # the second call reuses the graphed drafter's buffer and graphs
        ids, mask = _prompts(2, seed)
        a = sd.generate(target, ids, attention_mask=mask, drafter=graphed, max_new_tokens=24)
        b = sd.generate(target, ids, attention_mask=mask, drafter=eager, max_new_tokens=24)
        plain = sd.generate(target, ids, attention_mask=mask, max_new_tokens=24)
        assert graphed._graphs, "the graphed drafter never captured a graph"
        assert not eager._graphs
        assert torch.equal(a.sequences, b.sequences)
        assert a.stats.num_accepted_per_step == b.stats.num_accepted_per_step
        assert torch.equal(a.sequences, plain.sequences)


def test_cuda_graphs_survive_a_cache_reallocation(target):
    drafter = EagleDrafter(_heads(target)["eagle1"], DynamicTree(total_tokens=8, depth=3, top_k=2))
    ids, mask = _prompts(1)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=300 - ids.shape[1])
    ref = sd.generate(target, ids, attention_mask=mask, max_new_tokens=300 - ids.shape[1])
    assert torch.equal(out.sequences, ref.sequences)
    assert drafter._graph_cache.capacity >= 300


@pytest.mark.parametrize("make", ["draft_model", "prompt_lookup", "eagle2"])
def test_greedy_identity_on_cuda(target, make):
    drafter = {
        "draft_model": lambda: sd.DraftModelDrafter(noisy_copy(target, 0.3), num_drafts=4),
        "prompt_lookup": lambda: sd.PromptLookupDrafter(num_drafts=4),
        "eagle2": lambda: EagleDrafter(_heads(target)["eagle1"], DynamicTree(16, 4, 3)),
    }[make]()
    ids, mask = _prompts(2)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=32)
    ref = sd.generate(target, ids, attention_mask=mask, max_new_tokens=32)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.stats.tau >= 1.0


def test_sampled_tree_at_temperature_runs_eagerly(target):
    from specdec.trees import SampledTree

    drafter = EagleDrafter(_heads(target)["eagle1"], SampledTree([(0,), (1,), (0, 0)]))
    ids, mask = _prompts(2)
    out = sd.generate(target, ids, attention_mask=mask, drafter=drafter, max_new_tokens=16, temperature=1.0,
                      generator=torch.Generator(device="cuda").manual_seed(0))
    assert out.sequences.shape[1] == ids.shape[1] + 16
    # T > 0 with a sampled tree: its draft runs eagerly (random draws are not graph-captured); the update,
    # which draws nothing, may still be graphed
    assert not [key for key in drafter._graphs if key[1] is not None]
