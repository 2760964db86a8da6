"""The benchmark harness: every method runs on every prompt, figures are consistent, outputs are written."""
import copy
import json

import pytest
import torch
from tiny_models import tiny_model

from specdec import bench
from specdec.drafters import DraftModelDrafter, PromptLookupDrafter


def test_benchmark_times_methods_and_reports_tau_speedup_and_greedy_match(tmp_path):
    model = tiny_model("llama")
    model.generation_config.eos_token_id = None
    draft = copy.deepcopy(model)
    prompts = [torch.randint(1, 97, (1, 10), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    methods = {
        "HF vanilla": bench.hf_method(model, 12, pad_token_id=0),
        "specdec plain": bench.specdec_method(model, None, 12),
        "specdec self-draft": bench.specdec_method(model, lambda: DraftModelDrafter(draft, 3), 12),
        "specdec lookup": bench.specdec_method(model, lambda: PromptLookupDrafter(num_drafts=4), 12),
    }
    with open(tmp_path / "log.txt", "w") as log:
        results = bench.run_benchmark(methods, prompts, warmup=1, progress=False, log=log)
    by = {r.name: r for r in results}
    assert by["HF vanilla"].speedup == 1.0 and by["HF vanilla"].tau is None
    for r in results:
        assert r.new_tokens == 36 and r.extra["prompts"] == 3
        assert r.greedy_match == 1.0, f"{r.name} differs from HF greedy"
        assert r.tokens_per_second == pytest.approx(r.new_tokens / r.seconds)
    assert by["specdec plain"].tau == 1.0
    assert by["specdec self-draft"].tau > 3.0  # a draft equal to the target is always accepted
    assert by["specdec self-draft"].acceptance_per_depth == [1.0, 1.0, 1.0]
    assert len((tmp_path / "log.txt").read_text().splitlines()) == 12
    md = bench.to_markdown(results, "tiny")
    assert md.count("\n| ") == 5 and "specdec self-draft" in md
    bench.save_results(results, str(tmp_path / "r.json"), model="tiny")
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["meta"]["model"] == "tiny" and len(saved["results"]) == 4
    pytest.importorskip("matplotlib")
    bench.plot_results(results, str(tmp_path / "r.png"), "tiny")
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_time_budget_stops_after_the_prompt_that_passes_it():
    model = tiny_model("llama")
    prompts = [torch.randint(1, 97, (1, 6)) for _ in range(5)]
    results = bench.run_benchmark({"plain": bench.specdec_method(model, None, 4)}, prompts, warmup=0,
                                  progress=False, max_seconds=0.0)
    assert results[0].extra["prompts"] == 1


def test_best_schedule_picks_the_fastest_k_per_batch_size_and_merges_ranges():
    throughput = {1: {0: 100, 2: 250, 4: 300}, 2: {0: 180, 2: 400, 4: 390}, 4: {0: 350, 2: 500, 4: 420},
                  8: {0: 700, 2: 650, 4: 500}, 16: {0: 1200, 2: 900, 4: 700}}
    schedule = bench.best_schedule(throughput)
    assert schedule == [[1, 1, 4], [2, 7, 2], [8, 16, 0]]
    from specdec.schedule import make_schedule

    lookup = make_schedule(schedule, max_num_drafts=4)  # a valid Dynamic SD schedule
    assert [lookup(b) for b in (1, 2, 5, 8, 100)] == [4, 2, 2, 0, 0]


def test_best_schedule_prefers_the_smaller_k_on_ties():
    assert bench.best_schedule({1: {0: 10.0, 3: 10.0}}) == [[1, 1, 0]]


def test_batch_and_k_sweep_measures_every_cell():
    model = tiny_model("llama")
    prompts = [torch.randint(1, 97, (1, 6 + i)) for i in range(3)]
    out = bench.sweep_batch_and_k(model, lambda k: DraftModelDrafter(copy.deepcopy(model), k), prompts,
                                  batch_sizes=[1, 3], ks=[0, 2], max_new_tokens=6, progress=False)
    assert set(out) == {1, 3} and all(set(row) == {0, 2} and min(row.values()) > 0 for row in out.values())


def test_eagle_tree_sweep_measures_every_pair_and_matches_plain(tmp_path):
    """examples/eagle_tree_sweep.py: one row per (depth, total_tokens), outputs identical to plain greedy."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "examples" / "eagle_tree_sweep.py"
    spec = importlib.util.spec_from_file_location("eagle_tree_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from specdec.heads import Eagle1Head

    target = tiny_model("llama", layers=2)
    head = Eagle1Head.from_target(target).float()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 90, (1, 10), generator=g) for _ in range(2)]
    rows = module.sweep(target, head, prompts, depths=[2, 3], totals=[4, 8], top_k=3, max_new_tokens=12,
                        progress=False)
    assert [(r["depth"], r["total_tokens"]) for r in rows] == [(2, 4), (2, 8), (3, 4), (3, 8)]
    for r in rows:
        assert r["same_output"] == 1.0
        assert 1.0 <= r["tau"] <= r["depth"] + 1
        assert len(r["acceptance_per_depth"]) == r["depth"]
        assert r["top_k"] == min(3, r["total_tokens"] - 1)
    md = module.to_markdown(rows, "tiny")
    assert md.count("\n| ") == 1 + len(rows)  # header + one line per pair
    pytest.importorskip("matplotlib")
    module.plot(rows, str(tmp_path / "sweep.png"), "tiny")
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_no_gc_times_a_call_without_the_collector_and_restores_it():
    import gc
    import weakref

    from specdec.bench import no_gc

    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()  # a caller's own setting is kept
    finally:
        gc.enable()
    with pytest.raises(ValueError), no_gc():
        raise ValueError("inside")
    assert gc.isenabled()

    class Cycle:
        pass
    cycle = Cycle()
    cycle.me = cycle
    alive = weakref.ref(cycle)
    del cycle
    with no_gc(collect=True):  # collected before the call
        assert alive() is None
