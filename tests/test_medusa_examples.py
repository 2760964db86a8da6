"""The Medusa example scripts run end to end on tiny models built from configs (``--quick``, CPU, seconds):
examples/train_medusa.py (Medusa-1, then Medusa-2 warm-started from it) and examples/medusa_ablation.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    import train_medusa

    root = tmp_path_factory.mktemp("medusa")
    assert train_medusa.main(["--quick", "--out-dir", str(root / "m1")]) == 0
    assert train_medusa.main(["--quick", "--method", "medusa2", "--medusa1", str(root / "m1" / "medusa"),
                              "--out-dir", str(root / "m2")]) == 0
    return root


def test_train_medusa_quick_writes_heads_tree_and_summary(trained):
    import transformers
    from train_medusa import tiny_target

    from specdec.formats.medusa import load_medusa_head
    from specdec.trees import compile_tree

    m1, m2 = trained / "m1", trained / "m2"
    tree = json.loads((m1 / "tree.json").read_text())
    compiled = compile_tree([tuple(p) for p in tree["choices"]])
    assert compiled.num_nodes <= tree["num_nodes"] == 63 and compiled.max_depth <= 3
    assert tree["model_tau"]["optimised"] >= tree["model_tau"]["mc_sim_7b_63"] - 1e-9
    assert tree["model_tau"]["sequoia"] >= tree["model_tau"]["optimised"] - 1e-9
    summary = json.loads((m1 / "summary.json").read_text())
    assert summary["method"] == "medusa1" and summary["train_files"] > 0 and summary["tree"]["calibration_steps"] > 0
    head = load_medusa_head(m1 / "medusa", tiny_target(0))
    assert head.config.num_heads == 3
    target2 = transformers.AutoModelForCausalLM.from_pretrained(m2 / "target")
    load_medusa_head(m2 / "medusa", target2)
    s2 = json.loads((m2 / "summary.json").read_text())
    assert s2["method"] == "medusa2" and "kl" in s2["final_metrics"] and s2["kl_to_original"] >= 0


def test_medusa_ablation_quick_runs_every_row(tmp_path):
    import medusa_ablation

    assert medusa_ablation.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    names = [r["name"] for r in results]
    assert names[0] == "HF vanilla" and "EAGLE-2" in names and "HF assisted generation (draft model)" in names
    assert [n for n in names if n.startswith("Medusa")] == [
        "Medusa-1, chain of top-1s (no tree)", "Medusa-1, mc_sim_7b_63 tree", "Medusa-1, optimised tree (8 nodes)",
        "Medusa-2, optimised tree (8 nodes, own target)"]
    for r in results:  # float32: every row equals the plain decoding of its own target
        assert r["greedy_match"] == 1.0, r["name"]
    medusa2 = next(r for r in results if r["name"].startswith("Medusa-2"))
    assert medusa2["extra"]["identity_reference"] == "HF vanilla, Medusa-2 target"
    assert (tmp_path / "results.md").read_text().count("| Medusa") == 4
    assert (tmp_path / "results.png").exists()
