"""Session 31's figure: prompt lookup's step by variant (call D: the search as torch ops or one kernel, the drafter
eager, graphed, folded; batch 1, 4, 16) and the fixture beside gpt-fast (call C, tokens/s).

    python docs/results/fast_s31/scripts/plot_s31.py   # writes docs/results/fast_s31/session31.png
"""
import json
import os
import tarfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> None:
    ab = json.load(open(os.path.join(HERE, "callD", "lookup.json")))
    with tarfile.open(os.path.join(HERE, "callC", "bm.tgz")) as tar:
        rows = json.load(tar.extractfile("bm/results.json"))["rows"]
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.8))
    variants = ["lookup eager, torch search", "lookup eager", "lookup folded, torch search", "lookup graphed",
                "lookup folded", "fast plain"]
    labels = ["drafter eager,\ntorch search", "drafter eager,\nn-gram kernel", "folded,\ntorch search",
              "graphed\n(3 replays)", "folded\n(1 replay)", "fast plain\n(no drafts)"]
    batches = list(ab)
    width = 0.8 / len(batches)
    for j, batch in enumerate(batches):
        ax[0].bar([i + (j - (len(batches) - 1) / 2) * width for i in range(len(variants))],
                  [ab[batch][v]["ms/step"] for v in variants], width, label=batch)
    ax[0].set_xticks(range(len(variants)), labels, fontsize=8)
    ax[0].set_ylabel("ms per step (median of 24 / 8 calls)")
    ax[0].set_title("prompt lookup K=10 on the fixture's fast path (H200, bf16, 128 new tokens):\n"
                    "steps captured and folded, the search in one kernel", fontsize=10)
    ax[0].legend(fontsize=8)
    tps = {r["method"]: r["tokens_per_s"] for r in rows if r.get("batch") == 1}
    names = [m for m in tps]
    ax[1].barh(range(len(names)), [tps[m] for m in names],
               color=["tab:gray" if "specdec" not in m else "tab:blue" for m in names])
    ax[1].set_yticks(range(len(names)), names, fontsize=8)
    ax[1].invert_yaxis()
    ax[1].set_xlabel("tokens/s, batch 1 (6 of 8 prompts timed)")
    ax[1].set_title("the fixture beside gpt-fast in one process (call C)", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "session31.png"), dpi=110)


if __name__ == "__main__":
    main()
