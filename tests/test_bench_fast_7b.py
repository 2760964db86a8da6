"""examples/bench_fast_7b.py --tiny: every row measured on any machine; the fast rows run generate()'s late steps."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import specdec.static

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_fast_7b", ROOT / "examples" / "bench_fast_7b.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_tiny_shape_measures_every_row_and_the_fast_speculative_step_is_the_captured_one(monkeypatch):
    bench = _bench()
    calls = []
    original = specdec.static.StaticAdapter.forward_commit

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(specdec.static.StaticAdapter, "forward_commit", counted)
    rows = bench.main(["--tiny", "--batches", "2", "--reps", "2", "--warmup", "1", "--context", "16"])
    row = rows[2]
    assert not row.get("errors"), row.get("errors")
    for name in ("hf_eager", "eager_plain", "fast_plain", "fast_plain_cublas", "fast_plain_attn",
                 "fast_plain_kernels", "eager_spec", "fast_spec", "fast_spec_kernels", "fast_spec_fr", "fast_spec_fr8",
                 "floor"):
        assert math.isfinite(row[name]) and row[name] > 0, (name, row)
    assert len(calls) >= 3  # the fast speculative step's warm-up and timed runs: forward + verify + commit captured


def test_queued_runs_time_that_many_steps_and_the_restricted_head_drafts_its_subset(monkeypatch):
    bench = _bench()
    steps, drafted = [], []
    original = specdec.static.StaticAdapter.forward_commit

    def counted(self, cache, nodes, *args, **kwargs):
        steps.append(1)
        present = args[0][:, 1:] >= 0  # (parents, ...): the drafts that are there (present=None: those with a parent)
        drafted.append(nodes[:, 1:][present].tolist())
        return original(self, cache, nodes, *args, **kwargs)
    monkeypatch.setattr(specdec.static.StaticAdapter, "forward_commit", counted)
    rows = bench.main(["--tiny", "--batches", "1", "--reps", "2", "--warmup", "1", "--context", "16", "--queued",
                       "3", "--draft-vocab", "40", "--only", "fast_spec_fr"])
    assert not rows[1].get("errors") and rows[1]["fast_spec_fr"] > 0
    assert len(steps) == 1 + 2 * 3  # the warm-up, then two timed runs of three queued steps
    V = bench.TINY["vocab_size"]
    import torch
    kept = set(torch.randperm(V, generator=torch.Generator().manual_seed(2))[:40].tolist())
    assert all(ids and set(ids) <= kept for ids in drafted)


def test_ragged_runs_prefill_left_padded_prompts_of_different_lengths(monkeypatch):
    bench = _bench()
    mask = bench.ragged_mask(4, 16, "cpu")
    assert mask.sum(1).tolist() == [16, 14, 12, 10] and (mask[:, -1] == 1).all()
    assert (mask.diff(dim=1) >= 0).all()  # left padding: zeros, then ones
    masks = []
    original = specdec.static.StaticAdapter.prefill

    def recorded(self, ids, attention_mask=None, *args, **kwargs):
        masks.append(attention_mask)
        return original(self, ids, attention_mask, *args, **kwargs)
    monkeypatch.setattr(specdec.static.StaticAdapter, "prefill", recorded)
    rows = bench.main(["--tiny", "--batches", "4", "--reps", "1", "--warmup", "1", "--context", "16", "--ragged",
                       "--only", "fast_plain", "fast_spec"])
    assert not rows[4].get("errors") and rows[4]["fast_plain"] > 0 and rows[4]["fast_spec"] > 0
    assert masks and all(m is not None and m.sum(1).tolist() == [16, 14, 12, 10] for m in masks)


def test_the_4bit_head_row_runs_when_named_at_any_group_size():
    bench = _bench()
    args = ["--tiny", "--batches", "1", "--reps", "1", "--warmup", "1", "--context", "16", "--draft-vocab", "40",
            "--only", "fast_spec_fr4"]
    for group in ("32", "128"):  # the tiny head is 64 wide: padded to 256 at 128 inputs per scale
        rows = bench.main(args + ["--int4-group", group])
        assert not rows[1].get("errors") and rows[1]["fast_spec_fr4"] > 0 and "fast_spec_fr8" not in rows[1]


def test_eagle_fold_builds_folding_drafters_for_the_speculative_rows():
    """``--eagle-fold``: the EAGLE-2 rows run on ``EagleDrafter(fold=True)`` (the update and next draft inside the
    verify step where the device captures) and still time a step."""
    from specdec.graphs import GraphedDrafter

    bench = _bench()
    made = []
    real = GraphedDrafter.__init__

    def spy(self, drafter, *args, **kwargs):
        made.append(drafter)
        real(self, drafter, *args, **kwargs)
    GraphedDrafter.__init__ = spy
    try:
        rows = bench.main(["--tiny", "--batches", "1", "--reps", "1", "--warmup", "1", "--context", "16",
                           "--draft-vocab", "40", "--only", "fast_spec_fr8", "--eagle-fold"])
    finally:
        GraphedDrafter.__init__ = real
    assert not rows[1].get("errors") and rows[1]["fast_spec_fr8"] > 0
    eagles = [d for d in made if type(d).__name__ == "EagleDrafter"]
    assert eagles and all(d.folds_drafts for d in eagles)
