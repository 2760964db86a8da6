"""Session 29's figure: (left) where the host spends a fast step (call A: random heads, 127 steps a call, host time
per step by phase, beside the step's wall time); (right) the fixture beside gpt-fast in one process (call C), each
speculative row as a ratio to gpt-fast's SpS at the same K.

    python docs/results/fast_s29/scripts/plot_s29.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
host = json.load(open(os.path.join(HERE, "callA", "host.json")))
rows = json.load(open(os.path.join(HERE, "callC", "bm", "results.json")))["rows"]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.5))
methods = ["plain", "P-EAGLE", "DFlash", "P-EAGLE prefetch", "DFlash prefetch"]
phases = ["propose", "verify step", "update", "plain forward"]
left = [0.0] * len(methods)
for phase in phases + ["rest of step()", "other (generate loop, rows, stats)", "wait for tokens"]:
    vals = []
    for m in methods:
        split = host[m]["host_ms_per_step"]
        if phase == "rest of step()":
            vals.append(split["step()"] - sum(split.get(p, 0.0) for p in phases))
        else:
            vals.append(split.get(phase, 0.0))
    ax1.barh(methods, vals, left=left, label=phase)
    left = [a + b for a, b in zip(left, vals)]
ax1.scatter([host[m]["ms_per_step"] for m in methods], methods, color="k", marker="|", s=400, zorder=3,
            label="wall per step")
ax1.set_xlabel("host ms per step (perf_counter per phase; H200 host)")
ax1.set_title("Call A: the parallel steps' host time (random heads)")
ax1.invert_yaxis()
ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4)

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
ax2.set_title("Call C: every method beside gpt-fast, one process")
ax2.tick_params(axis="y", labelsize=7)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "session29.png"), dpi=110)
print("wrote session29.png")
