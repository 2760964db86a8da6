"""Session 50: the in-process A/B of call B (ab_int4.py, 7B EAGLE-2 step with the 4-bit head, H100, three alternating
rounds), each variant's median step time against the library's, as horizontal bars.
Usage: python ab_plot.py LOG OUT.png (repository root)."""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def table(path: str) -> dict[str, float]:
    """variant -> median ms, from the table ab_int4.py prints last."""
    rows, inside = {}, False
    for line in open(path):
        if line.startswith("variant"):
            inside = True
        elif inside and line.strip() and not line.startswith(("[", " ")):
            name, ms = line.split()[:2]
            rows[name] = float(ms)
    return rows


def main(log: str, out: str) -> None:
    rows = table(log)
    base = rows.pop("lib")
    rows.pop("plain", None)
    names = sorted(rows, key=rows.get)
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(names) + 1.2))
    ax.barh(names, [1e3 * (rows[n] - base) for n in names],
            color=["tab:green" if rows[n] < base else "tab:red" for n in names])
    ax.axvline(0, color="k", lw=1)
    ax.set_xlabel(f"step time - the library's ({base:.3f} ms), us")
    ax.set_title("7B EAGLE-2 step, 4-bit head, H100, one process (session 50, call B)", fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
