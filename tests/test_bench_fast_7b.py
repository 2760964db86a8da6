"""examples/bench_fast_7b.py --tiny: every row measured on any machine; the fast rows run generate()'s late steps."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import specdec.static

ROOT = Path(__file__).resolve().parents[1]


def test_the_tiny_shape_measures_every_row_and_the_fast_speculative_step_is_the_captured_one(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_fast_7b", ROOT / "examples" / "bench_fast_7b.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
                 "fast_plain_kernels", "eager_spec", "fast_spec", "fast_spec_kernels", "floor"):
        assert math.isfinite(row[name]) and row[name] > 0, (name, row)
    assert len(calls) >= 3  # the fast speculative step's warm-up and timed runs: forward + verify + commit captured
