"""Session 26's plot: weights prefetched into L2 during attention (call B), top-k per call with packed keys and by
chunk width (call E), ragged batches with visible_end + kv_start against prefix_end (call B).
python plot_s26.py [OUT.png]"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = Path(__file__).resolve().parent.parent
l2 = json.loads((here / "callB" / "l2_overlap.json").read_text())
topk = json.loads((here / "callE" / "topk.json").read_text())
ragged = {run: json.loads((here / "callB" / "b7" / run / "results.json").read_text())["rows"] for run in ("on", "off")}

fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
for stack, label in (("verify", "verify stack (61 rows, tree attention)"), ("plain", "plain stack (1 row, SDPA)")):
    mbs = sorted({int(k.split("pf=")[1].split("MB")[0]) for k in l2 if k.startswith(stack)})
    vals = [min(v for k, v in l2.items() if k.startswith(f"{stack} pf={mb}MB")) for mb in mbs]
    a.plot(mbs, vals, marker="o", label=label)
a.set_xlabel("MB of the next weights prefetched into L2 per layer")
a.set_ylabel("ms per 32-layer stack + lm_head")
a.set_title("L2 prefetch during attention (H200): slower")
a.legend(fontsize=8)

chunks = (4096, 2048, 1024, 512)
for shape, style in (("[10, 8192]", "-"), ("[1, 8192]", "--"), ("[40, 8192]", ":")):
    for mode, color in (("two-reductions", "tab:gray"), ("packed", "tab:blue")):
        b.plot(chunks, [topk[shape][f"{mode} chunk={ch}"] for ch in chunks], style, color=color, marker="o",
               label=f"{shape} {mode}")
b.set_xscale("log", base=2)
b.set_xlabel("chunk width (entries per program)")
b.set_ylabel("us per log-softmax + top-10")
b.set_title("top-k: packed keys, narrower chunks for few rows")
b.legend(fontsize=7)

batches = ["4", "16"]
width = 0.35
for i, (run, label) in enumerate((("on", "visible_end + kv_start"), ("off", "prefix_end"))):
    vals = [ragged[run][bt]["fast_spec_fr8"] for bt in batches]
    bars = c.bar([j + (i - 0.5) * width for j in range(len(batches))], vals, width, label=label)
    c.bar_label(bars, fmt="%.2f", fontsize=8)
c.set_xticks(range(len(batches)), [f"batch {bt}" for bt in batches])
c.set_ylabel("ms per 7B EAGLE-2 step (float8 FR head)")
c.set_title("ragged (left-padded) batches")
c.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[1] if len(sys.argv) > 1 else here / "session26.png", dpi=110)
