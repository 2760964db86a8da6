"""Session 46: the 4-bit head's trade, drawn: the 7B EAGLE-2 step per head precision (H100, calls C and D, each
process's float8 and 4-bit rows) beside the fixture head's tau (CPU, ``int4_tau_lib.py``).

    python docs/results/fast_s46/scripts/plot_int4.py docs/results/fast_s46
"""
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    root = sys.argv[1]
    steps = {"float8": [], "4-bit g128": [], "4-bit g64": [], "4-bit g32": []}
    plain = []
    for path in sorted(glob.glob(os.path.join(root, "call[CD]", "b7_*_g*.log"))):
        group = re.search(r"_g(\d+)\.log$", path).group(1)
        line = next(x for x in open(path) if x.startswith("batch 1:"))
        row = json.loads(line.split(":", 1)[1])
        steps["float8"].append(row["fast_spec_fr8"])
        steps[f"4-bit g{group}"].append(row["fast_spec_fr4"])
        plain.append(row["fast_plain"])
    tau_line = [x for x in open(os.path.join(root, "cpu", "int4_tau_lib.log")) if x.startswith("{")][-1]
    tau = json.loads(tau_line)
    taus = {"float8": tau["float8"]["tau"], "4-bit g128": tau["4-bit, 128 per scale"]["tau"],
            "4-bit g64": tau["4-bit, 64 per scale"]["tau"], "4-bit g32": tau["4-bit, 32 per scale"]["tau"]}
    names = list(steps)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, name in enumerate(names):
        a.scatter([i] * len(steps[name]), steps[name], color="C0")
    mean_plain = sum(plain) / len(plain)
    a.axhline(1.3 * mean_plain, color="C3", ls="--", label=f"1.3x plain step ({1.3 * mean_plain:.2f} ms)")
    a.set_xticks(range(len(names)), names)
    a.set_ylabel("7B EAGLE-2 step, ms (H100)")
    a.set_title("step time (one dot per process)")
    a.legend(loc="upper left", fontsize=8)
    b.bar(range(len(names)), [taus[n] for n in names], color="C1")
    b.axhline(tau["as trained"]["tau"], color="k", ls=":", label=f"as trained ({tau['as trained']['tau']:.3f})")
    b.set_ylim(2.4, 2.75)
    b.set_xticks(range(len(names)), names)
    b.set_ylabel("tau, fixture EAGLE-1 head, EAGLE-2 (CPU)")
    b.set_title("tokens per target forward")
    b.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(root, "int4_tradeoff.png"), dpi=110)
    print({n: (round(sum(v) / len(v), 3) if v else None, round(taus[n], 3)) for n, v in steps.items()})


if __name__ == "__main__":
    main()
