"""Session 16: the 7B EAGLE-2 step at batch 1 (graphs) by session, against the fast plain step and 1.3x of it.

Figures from docs/fast_path.md (each session's bench_fast_7b.py run at batch 1; the plain step of the same run).
Run: python docs/results/fast_s16/scripts/plot_step_history.py (writes step_history.png beside this folder).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SESSIONS = [10, 11, 12, 13, 14, 15, 16]
STEP = [9.43, 8.14, 7.71, 7.67, 7.44, 6.88, 6.63]    # one EAGLE-2 step (depth 6, 60 nodes), ms
PLAIN = [5.18, 4.23, 4.26, 4.22, 4.27, 4.21, 4.21]   # fast plain step of the same run, ms

fig, ax = plt.subplots(figsize=(6.4, 3.8))
ax.plot(SESSIONS, STEP, "o-", label="fast EAGLE-2 step")
ax.plot(SESSIONS, PLAIN, "s-", label="fast plain step")
ax.plot(SESSIONS, [1.3 * p for p in PLAIN], "--", color="gray", label="issue 13's target: 1.3x plain")
for s, t, p in zip(SESSIONS, STEP, PLAIN):
    ax.annotate(f"{t / p:.2f}x", (s, t), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
ax.set_xlabel("session")
ax.set_ylabel("ms per step (H200, batch 1)")
ax.set_title("Llama-2-7B shape, random weights, bf16, context 512")
ax.set_ylim(0, 10)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "step_history.png"), dpi=120)
