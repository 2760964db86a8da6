"""examples/bench_fast_rounds.py: its GPU-busy arithmetic and kernel summaries, and its refusal without CUDA."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_busy_time_counts_overlapping_kernels_once_and_gaps_never():
    import bench_fast_rounds as br

    assert br.busy_us([]) == 0.0
    assert br.busy_us([(5, 6), (0, 2), (1, 3)]) == 4.0
    assert br.busy_us([(0, 10), (2, 3), (4, 5)]) == 10.0


def test_kernel_summary_is_per_unit_and_ranks_kernels_by_time():
    import bench_fast_rounds as br

    events = [("attn", 0, 30), ("mm", 30, 35), ("attn", 40, 70), ("mm", 70, 75), ("mm", 75, 80)]
    out = br.kernel_summary(events, per=2)
    assert out["kernels_per"] == 2.5
    assert out["gpu_busy_us_per"] == 37.5  # (35 + 40) / 2
    assert out["top"][0] == ("attn", 1.0, 30.0)
    assert out["top"][1] == ("mm", 1.5, 7.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_it_says_where_to_run_it():
    import bench_fast_rounds as br

    with pytest.raises(SystemExit, match="GPU machine"):
        br.main(["--target", "t", "--data", "d"])


def test_the_rounds_plot_is_written(tmp_path):
    import bench_fast_rounds as br

    path = tmp_path / "rounds.png"
    br.plot_rounds({"run A": {"specdec plain": [10.0, 12.0, 11.0], "gpt-fast vanilla": [9.0, 9.5, 8.0]},
                    "run B": {"specdec plain": [20.0, 21.0, 19.0]}}, str(path), "title")
    assert path.stat().st_size > 1000
