"""Session 27's figure: (left) the 61-row verify's linears in a chain, cuBLASLt against the best TMA and pointer
launches (calls A and C); (right) the fixture beside gpt-fast at this session's code (call E), tokens/s.

    python docs/results/fast_s27/scripts/plot_s27.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
a = json.load(open(os.path.join(HERE, "callA", "tiles.json")))
c = json.load(open(os.path.join(HERE, "callC", "tiles.json")))
rows = json.load(open(os.path.join(HERE, "callE", "bm", "results.json")))["rows"]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
shapes = list(a)
kinds = [("cuBLASLt", lambda r, _: r["cublaslt"]),
         ("skinny (pointer loads, default)", lambda r, _: r["skinny default"]),
         ("best TMA", lambda r, _: min(v for k, v in r.items() if k.startswith("tma") and v)),
         ("best wide tile", lambda r, _: min((v for k, v in r.items() if k.startswith("wide") and v), default=0)),
         ("best TMA, weights before the PDL wait", lambda r, s: min(v for k, v in c[s].items()
                                                                    if k.startswith("tma") and not k.endswith(" 0)")))]
w = 0.16
for i, (label, get) in enumerate(kinds):
    ax1.bar([j + i * w for j in range(len(shapes))], [get(a[s], s) for s in shapes], w, label=label)
ax1.set_xticks([j + 2 * w for j in range(len(shapes))], shapes)
ax1.set_ylabel("us per linear (61 rows, chain of 16, CUDA graph)")
ax1.set_title("7B verify linears: no launch beats cuBLASLt by more than 0.6 us")
ax1.legend(fontsize=8)

by = {r["method"]: r for r in rows if r["batch"] == 1}
names = [n for n in by if not n.startswith("HF") and "eager draft" not in n]
vals = [by[n]["tokens_per_s"] for n in names]
colors = ["tab:gray" if n.startswith("gpt-fast") else "tab:blue" for n in names]
ax2.barh(names[::-1], vals[::-1], color=colors[::-1])
ax2.axvline(by["gpt-fast SpS K=8"]["tokens_per_s"], color="k", ls="--", lw=0.8, label="gpt-fast SpS K=8")
ax2.set_xlabel("tokens/s (fixture, batch 1, bf16, greedy, 4 prompts timed)")
ax2.set_title("Session 27, call E: specdec fast path beside gpt-fast, one process")
ax2.tick_params(axis="y", labelsize=7)
ax2.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "session27.png"), dpi=110)
print("wrote session27.png")
