"""Session 28's figure: (left) per-call wall time of the fast plain, P-EAGLE and DFlash steps (random heads, 127
steps a call) in three process states, against their device time per call (call A); (right) the fixture beside
gpt-fast in one process (call D), each speculative row as a ratio to gpt-fast's SpS at the same K.

    python docs/results/fast_s28/scripts/plot_s28.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
env = json.load(open(os.path.join(HERE, "callA", "env.json")))
rows = json.load(open(os.path.join(HERE, "callD", "bm", "results.json")))["rows"]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
stages = ["base", "cudnn-off", "gpt-fast"]
methods = ["plain", "P-EAGLE", "DFlash"]
w = 0.25
for i, m in enumerate(methods):
    xs = [j + i * w for j in range(len(stages))]
    med = [env[s][m]["call_ms_median"] for s in stages]
    lo = [med[k] - env[s][m]["call_ms_min"] for k, s in enumerate(stages)]
    hi = [env[s][m]["call_ms_max"] - med[k] for k, s in enumerate(stages)]
    bars = ax1.bar(xs, med, w, yerr=[lo, hi], capsize=3, label=f"{m}: wall per call (median, min-max)")
    device_ms = env[f"{m} kernels"]["device_us_per_step"] * env[stages[0]][m]["steps"] / 1e3
    ax1.hlines(device_ms, xs[0] - w / 2, xs[-1] + w / 2, colors=bars.patches[0].get_facecolor(), linestyles=":",
               label=f"{m}: device time per call ({env[f'{m} kernels']['per_step']:.0f} kernels a step)")
ax1.set_xticks([j + w for j in range(len(stages))], ["specdec alone", "+ cuDNN SDPA off", "+ gpt-fast compiled"])
ax1.set_ylabel("ms per 128-token call (127 steps, random heads)")
ax1.set_title("Call A: P-EAGLE / DFlash steps are host-bound")
ax1.set_ylim(0, 300)
ax1.legend(fontsize=7, loc="upper left", ncol=2)

by = {r["method"]: r for r in rows if r["batch"] == 1}


def k_of(name):
    if "SpS K=" in name:
        return int(name.split("K=")[1].split(",")[0])
    if "chain K=" in name:
        return int(name.split("chain K=")[1])
    return 8  # the default chains (7-8 drafts), the trees, EAGLE, Medusa and prompt lookup: against K = 8


names = [n for n in by if n.startswith("specdec") and "plain" not in n]
ratios = [by[n]["tokens_per_s"] / by[f"gpt-fast SpS K={k_of(n)}"]["tokens_per_s"] for n in names]
colors = ["tab:red" if r < 1 else "tab:blue" for r in ratios]
labels = [f"{n[len('specdec fast '):]} (vs K={k_of(n)})" for n in names]
ax2.barh(labels[::-1], ratios[::-1], color=colors[::-1])
ax2.axvline(1.0, color="k", ls="--", lw=0.8)
ax2.set_xlabel("tokens/s over gpt-fast SpS at the same K (batch 1, 5 prompts timed)")
ax2.set_title("Call D: beside gpt-fast, one process (no P-EAGLE row)")
ax2.tick_params(axis="y", labelsize=7)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "session28.png"), dpi=110)
print("wrote session28.png")
