"""examples/ablate_draft_vocab.py on the embedded demo: every size decodes the plain output, sizes ordered."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_draft_vocabulary_gives_the_plain_output_and_a_plot(tmp_path):
    spec = importlib.util.spec_from_file_location("ablate_draft_vocab", ROOT / "examples" / "ablate_draft_vocab.py")
    ablate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablate)
    out = ablate.main(["--num-prompts", "1", "--max-new-tokens", "12", "--sizes", "2048", "64", "--max-files", "20",
                       "--total-tokens", "12", "--depth", "3", "--top-k", "3", "--out", str(tmp_path)])
    full, small = out["rows"]
    assert full["size"] == out["vocab_size"] == 2048 and small["size"] == 64
    assert full["identical"] and small["identical"]  # lossless at every size
    assert full["same_token_rate"] == small["same_token_rate"] == 1.0 and out["dtype"] == "float32"
    assert full["coverage"] == 1.0 and 0.0 < small["coverage"] < 1.0
    assert full["tau"] >= 1.0 and small["tau"] >= 1.0
    assert small["lm_head_mb"] * 32 == full["lm_head_mb"]
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == out["rows"]
    assert (tmp_path / "tau_vs_vocab.png").stat().st_size > 0
