"""examples/profile_fast_step.py: the per-step op counts split by region, and the module names restored after."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import profile_fast_step  # noqa: E402

import specdec.kernels  # noqa: E402
import specdec.static  # noqa: E402


def test_the_profile_counts_each_region_per_step_and_restores_the_kernels():
    model = profile_fast_step.tiny_llama()
    ids = torch.randint(1, 97, (2, 8), generator=torch.Generator().manual_seed(0))
    kernels = (specdec.static.tree_mask, specdec.kernels.KVCompactPlan.__call__, specdec.kernels.verify_greedy)
    plain = profile_fast_step.per_step(model, ids, "plain", short=2, long=5)
    tree = profile_fast_step.per_step(model, ids, "eagle2", short=2, long=5)
    assert (specdec.static.tree_mask, specdec.kernels.KVCompactPlan.__call__, specdec.kernels.verify_greedy) == kernels
    # A plain step: one target forward, no drafter, no kernel launch (its mask row only gains a column).
    assert plain["target graph"] > 50 and plain["drafter graphs"] == 0 and plain["kernels"] == 0
    assert 0 < plain["outside"] <= 7  # 7: the tokens' copy for the host counts as on CUDA (LateTokens)
    # A tree step: no launch outside the graphs; the tree mask (from the device-side write slot), the verifier, the
    # emitted tokens, the feedback rows and the compaction run inside the target's captured step
    # (StaticAdapter.forward_commit), so its region holds more ops than a plain forward's; the drafter is captured.
    assert tree["kernels"] == 0 and tree["target graph"] > plain["target graph"] + 20
    assert tree["drafter graphs"] > 50 and tree["outside"] > plain["outside"]


def test_the_host_timing_stubs_the_device_work_and_restores_it():
    model = profile_fast_step.tiny_llama()
    ids = torch.randint(1, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    swapped = (specdec.static.capture_graph_ref, specdec.static.tree_mask, specdec.kernels.KVCompactPlan.__call__,
               specdec.kernels.verify.verify_greedy_ref)
    plain = profile_fast_step.host_ms_per_step(model, ids, "plain", short=4, long=12, repeats=1)
    tree = profile_fast_step.host_ms_per_step(model, ids, "eagle2", short=4, long=12, repeats=1)
    assert (specdec.static.capture_graph_ref, specdec.static.tree_mask, specdec.kernels.KVCompactPlan.__call__,
            specdec.kernels.verify.verify_greedy_ref) == swapped
    assert math.isfinite(plain) and math.isfinite(tree)  # timings (too noisy on a shared CPU to compare here)
    with profile_fast_step.device_work_stubbed():  # a stubbed kernel returns its first result for the same shapes
        a = specdec.static.tree_mask(torch.ones(1, 3, dtype=torch.bool), torch.tensor([[-1, 0]]),
                                     torch.ones(1, 2, dtype=torch.bool), torch.float32)
        b = specdec.static.tree_mask(torch.zeros(1, 3, dtype=torch.bool), torch.tensor([[-1, 0]]),
                                     torch.ones(1, 2, dtype=torch.bool), torch.float32)
        assert b is a


def test_every_drafter_is_profiled_with_its_steps_captured():
    """The parallel drafters (P-EAGLE, DFlash, Medusa) profile as EAGLE-2 does: their work sits in the drafter's
    captured steps, nothing launches outside the graphs, and the eager work around the graphs stays small."""
    model = profile_fast_step.tiny_llama()
    ids = torch.randint(1, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    plain = profile_fast_step.per_step(model, ids, "plain", short=2, long=5)
    for method in ("peagle", "dflash", "medusa"):
        result = profile_fast_step.per_step(model, ids, method, short=2, long=5)
        assert result["kernels"] == 0 and result["drafter graphs"] > 20, (method, result)
        assert result["target graph"] > plain["target graph"] and plain["outside"] < result["outside"] < 100, method
    with pytest.raises(ValueError, match="method must be one of"):
        profile_fast_step.graphed_drafter(model, "eagle4", None)
