"""examples/bench_parallel.py --quick: every parallel and sequential drafter row, on the eager and the fast path."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fast", ["off", "graphs"])
def test_quick_mode_writes_every_row_and_every_row_is_lossless(tmp_path, fast):
    spec = importlib.util.spec_from_file_location("bench_parallel", ROOT / "examples" / "bench_parallel.py")
    bench_parallel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_parallel)
    bench_parallel.main(["--quick", "--ks", "3", "--fast", fast, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert {r["method"] for r in saved["rows"]} == {"EAGLE-2", "EAGLE-3", "P-EAGLE", "DFlash", "DSpark"}
    for row in saved["rows"]:
        assert row["greedy_match"] == 1.0, row  # float32: every lossless method emits HF's greedy tokens
        assert row["tau"] >= 1.0 and row["draft_ms"] > 0 and row["K"] == 3
    assert ("fast=True" in saved["title"]) == (fast == "graphs")
    assert (tmp_path / "results.md").exists()
    for row in saved["rows"]:  # what each benchmark call captured: recorded per call (CPU: nothing is held)
        calls = row["captures_per_call"]
        assert calls and all(set(c) == {"drafter_captures", "drafter_buffer_changes", "target_graphs_added",
                                        "target_buffers"} for c in calls)
        assert all(c["target_graphs_added"] == 0 and c["target_buffers"] == 0 for c in calls)
    assert "Captures inside the timed loop: none." in (tmp_path / "results.md").read_text()


def test_a_tree_size_sweep_gives_one_row_family_per_budget(tmp_path):
    """--tree optimal --tree-nodes 4 9: optimal level-wise trees of each budget from calibration prompts that are
    not evaluated, rows '<method>+tree<nodes>', each lossless and no larger than its budget."""
    spec = importlib.util.spec_from_file_location("bench_parallel", ROOT / "examples" / "bench_parallel.py")
    bench_parallel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_parallel)
    bench_parallel.main(["--quick", "--ks", "3", "--num-prompts", "3", "--calibration-prompts", "2", "--tree",
                         "optimal", "--tree-nodes", "4", "9", "--only", "P-EAGLE+tree4 K=3", "P-EAGLE+tree9 K=3",
                         "DFlash+tree9 K=3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    rows = {r["method"]: r for r in saved["rows"]}
    assert set(rows) == {"P-EAGLE+tree4", "P-EAGLE+tree9", "DFlash+tree9"}
    for name, row in rows.items():
        budget = int(name.split("+tree")[1])
        assert row["greedy_match"] == 1.0 and row["K"] == 3 and 1 <= row["tree_nodes"] <= budget, row
    assert rows["P-EAGLE+tree9"]["tree_nodes"] > rows["P-EAGLE+tree4"]["tree_nodes"]
