"""Session 50: the 7B gate's ratio (EAGLE-2 step with the 4-bit head / fast plain step, same process), one point per
process, by code and timing protocol: sessions 48-49 (the heads prefetching 512 bytes a weight row), session 50's
call B at that code, then with 128 bytes (the default since), each step timed from an idle device (bench_fast_7b.py's
default) and with 8 steps queued back to back (``--queued 8``, as the anchor times gpt-fast's step and as
generate() runs). Reads the ``batch 1:`` lines of the logs. Usage: python gate_plot.py OUT.png (repository root)."""
import glob
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, "docs/results/fast_s49/scripts")
from gate_plot import PROCESSES  # noqa: E402  (sessions 48-49, typed from their logs)

R = "docs/results/fast_s50/"


def ratios(pattern: str) -> list[float]:
    """EAGLE-2 (4-bit head) / plain of every log matching ``pattern``."""
    out = []
    for path in sorted(glob.glob(R + pattern)):
        for line in open(path):
            if line.startswith("batch 1:"):
                row = json.loads(line.split(":", 1)[1])
                out.append(row["fast_spec_fr4"] / row["fast_plain"])
    return out


GROUPS = [
    ("s48-49\n512 B, idle", [p[3] / p[1] for p in PROCESSES]),
    ("s50 call B\n512 B, idle", ratios("callB/b7_*.log")),
    ("s50 calls C-D\n128 B, idle", ratios("callC/b7_[0-9].log") + ratios("callD/g_*.log")),
    ("s50 calls C, E\n128 B, 8 queued", ratios("callC/b7_q*.log") + ratios("callE/q_*.log")),
]


def main(out: str) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for x, (_label, values) in enumerate(GROUPS):
        ax.plot([x + 0.04 * (i % 5 - 2) for i in range(len(values))], values, "o", alpha=0.8)
        ax.annotate(f"n={len(values)}", (x, max(values) + 0.004), ha="center", fontsize=8)
    ax.axhline(1.3, color="k", lw=1, ls="--", label="issue 13's 1.3x")
    ax.set_xticks(range(len(GROUPS)), [g[0] for g in GROUPS], fontsize=8)
    ax.set_ylabel("EAGLE-2 step / plain step")
    ax.set_title("7B shape, 4-bit head, H100: one point per process (median of 20 timed runs)", fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    for label, values in GROUPS:
        print(label.replace("\n", " "), " ".join(f"{v:.4f}" for v in sorted(values)))


if __name__ == "__main__":
    main(sys.argv[1])
