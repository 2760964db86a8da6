"""Session 17: the 7B EAGLE-2 step at batch 1 (graphs) by session, with the FR-Spec head of session 17 beside.

Figures from docs/fast_path.md (each session's bench_fast_7b.py run at batch 1, one step from an idle device; the
plain step of the same run). Run: python docs/results/fast_s17/scripts/plot_step_history.py (writes
step_history.png beside this folder).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HISTORY = {  # session: (EAGLE-2 step with the full-vocabulary head, fast plain step), ms
    10: (9.43, 5.18), 11: (8.14, 4.23), 12: (7.71, 4.26), 13: (7.67, 4.22), 14: (7.44, 4.27), 15: (6.88, 4.21),
    16: (6.63, 4.21), 17: (6.61, 4.19)}
FR_SPEC = {17: 6.29}  # the same step, the head's lm_head over 8192 of the 32000 ids (Eagle1Head.restrict_vocab)

sessions = sorted(HISTORY)
step = [HISTORY[s][0] for s in sessions]
plain = [HISTORY[s][1] for s in sessions]
fig, ax = plt.subplots(figsize=(6.4, 3.8))
ax.plot(sessions, step, "o-", label="fast EAGLE-2 step")
ax.plot(list(FR_SPEC), list(FR_SPEC.values()), "D", color="tab:red", label="+ FR-Spec draft vocabulary (8192)")
ax.plot(sessions, plain, "s-", label="fast plain step")
ax.plot(sessions, [1.3 * p for p in plain], "--", color="gray", label="issue 13's target: 1.3x plain")
for s, t, p in zip(sessions, step, plain):
    ax.annotate(f"{t / p:.2f}x", (s, t), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
for s, t in FR_SPEC.items():
    ax.annotate(f"{t / HISTORY[s][1]:.2f}x", (s, t), textcoords="offset points", xytext=(14, -10), fontsize=8,
                color="tab:red")
ax.set_xlabel("session")
ax.set_ylabel("ms per step (H200, batch 1)")
ax.set_title("Llama-2-7B shape, random weights, bf16, context 512")
ax.set_ylim(0, 10)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "step_history.png"), dpi=120)
