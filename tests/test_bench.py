"""The benchmark harness: every method runs on every prompt, figures are consistent, outputs are written."""
import copy
import json

import pytest
import torch

from specdec import bench
from specdec.drafters import DraftModelDrafter, PromptLookupDrafter
from tiny_models import tiny_model


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
