"""Session 25's plot: tree attention at the 7B verify with no bound, prefix_end and visible_end (call B), and
programmatic dependent launch on and off (calls D and E). python plot_s25.py [OUT.png]"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).resolve().parent.parent
attn = json.loads((here / "callB" / "attn_visible.json").read_text())


def best(rows, note):
    return min(r["us"] for r in rows if r["note"].startswith(note))


fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
shapes = [("verify_b1", "batch 1"), ("verify_b4", "batch 4"), ("verify_b16", "batch 16")]
width = 0.27
for i, (label, note) in enumerate((("no bound (plan)", "plan, no prefix"), ("prefix_end (plan)", "plan, prefix row"),
                                   ("visible_end (best launch)", "visible"))):
    vals = [best(attn[k], note) for k, _ in shapes]
    bars = a.bar([j + (i - 1) * width for j in range(len(shapes))], vals, width, label=label)
    a.bar_label(bars, fmt="%.1f", fontsize=7)
a.set_xticks(range(len(shapes)), [n for _, n in shapes])
a.set_ylabel("us per layer")
a.set_title("7B verify tree attention, 64 queries over 573 live keys (H200)")
a.legend(fontsize=8)
# PDL: ms per 7B step (call D, two processes each, median of the two) and the fixture's plain tokens/s (call E)
pdl = {"7B plain, batch 1": (4.175, 4.00), "7B EAGLE-2 fr8, batch 1": (5.755, 5.77),
       "7B plain, batch 4": (4.505, 4.355), "7B EAGLE-2 fr8, batch 4": (8.07, 8.10)}
names = list(pdl)
for i, (label, idx) in enumerate((("PDL off", 0), ("PDL on", 1))):
    bars = b.bar([j + (i - 0.5) * 0.38 for j in range(len(names))], [pdl[n][idx] for n in names], 0.38, label=label)
    b.bar_label(bars, fmt="%.2f", fontsize=7)
b.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=8)
b.set_ylabel("ms per step")
b.set_title("programmatic dependent launch (fixture plain: 2,963 -> 3,413 tok/s)")
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else str(here / "session25.png"), dpi=110)
