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
