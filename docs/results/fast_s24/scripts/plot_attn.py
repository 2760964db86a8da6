"""Session 24: plots of tree attention against the live keys (call C) and with / without prefix_end (call F)."""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rows = []
for line in open(os.path.join(HERE, "callC", "attn_slope.txt")):
    cells = [c.strip() for c in line.split("|")]
    if len(cells) == 5 and cells[0].isdigit():
        rows.append((int(cells[0]), float(cells[2]), float(cells[3]), float(cells[4])))
prefix = json.load(open(os.path.join(HERE, "callF", "attn_prefix.json")))
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
keys = [r[0] for r in rows]
for i, label in ((1, "tree attention, the plan (2 chunks + merge)"), (2, "tree attention, one chunk"),
                 (3, "SDPA, one query (the plain step)")):
    a.plot(keys, [r[i] for r in rows], marker="o", label=label)
a.set_xlabel("live keys")
a.set_ylabel("us per layer (32 layers, L2-cold)")
a.set_title("7B verify, batch 1, 64 queries (H200)")
a.legend(fontsize=8)
names = ["verify_b1", "verify_b4", "verify_b16", "head_level"]
without = [next(r["us"] for r in prefix[n] if r["note"] == "plan, no prefix") for n in names]
with_pre = [min(r["us"] for r in prefix[n] if r["note"] != "plan, no prefix") for n in names]
x = range(len(names))
b.bar([i - 0.2 for i in x], without, width=0.4, label="full mask tiles (plan)")
b.bar([i + 0.2 for i in x], with_pre, width=0.4, label="prefix_end (best launch)")
b.set_xticks(list(x), ["verify B=1", "verify B=4", "verify B=16", "head level"])
b.set_ylabel("us per layer")
b.set_title("one mask row for the committed slots")
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "tree_attention_s24.png"), dpi=110)
print("wrote", os.path.join(HERE, "tree_attention_s24.png"))
