"""Session 49: the 7B gate's ratio (EAGLE-2 step / fast plain step, same process) per process at the code of sessions
48-49, for the 4-bit and the float8 head, against the issue's 1.3x. Figures typed from the logs named beside them
(``docs/results/fast_s48/call*/``, ``docs/results/fast_s49/call*/``). Usage: python gate_plot.py OUT.png"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (label, plain ms, float8 head ms, 4-bit head ms)
PROCESSES = [
    ("s48 B1", 5.155, 6.823, 6.662), ("s48 B2", 5.135, 6.825, 6.673), ("s48 C", 5.233, 6.879, 6.674),
    ("s48 D", 5.144, 6.983, 6.673), ("s49 B1", 5.1484, 6.938, 6.7623), ("s49 B2", 5.2477, 6.9345, 6.6871),
    ("s49 B3", 5.2489, 6.9024, 6.7037), ("s49 C1", 5.2066, 6.9385, 6.7701), ("s49 C2", 5.2008, 6.9269, 6.7752),
]


def main(out: str) -> None:
    labels = [p[0] for p in PROCESSES]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, marker in ((3, "o"), (2, "s")):
        ax.plot(labels, [p[i] / p[1] for p in PROCESSES], marker, label=("4-bit head" if i == 3 else "float8 head"))
    ax.axhline(1.3, color="k", lw=1, ls="--", label="issue 13's 1.3x")
    ax.set_ylabel("EAGLE-2 step / plain step")
    ax.set_title("7B shape, H100, one process per point (median of 20 steps each)")
    ax.legend(loc="upper left", fontsize=8)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1])
