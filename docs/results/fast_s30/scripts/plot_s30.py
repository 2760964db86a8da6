"""Session 30's figure: the 7B steps' device time (busy / idle), the fold on / off (interleaved A/B), and the fixture
run beside gpt-fast (each speculative row against gpt-fast's SpS at its K).

    python docs/results/fast_s30/scripts/plot_s30.py   # writes docs/results/fast_s30/session30.png
"""
import json
import os
import tarfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> None:
    gaps = json.load(open(os.path.join(HERE, "callA", "gaps.json")))
    fold = json.load(open(os.path.join(HERE, "callC", "fold.json")))
    with tarfile.open(os.path.join(HERE, "callD", "bm.tgz")) as tar:
        rows = json.load(tar.extractfile("bm/results.json"))["rows"]
    tps = {r["method"]: r["tokens_per_s"] for r in rows if r.get("batch") == 1}
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    names = {"plain": "fast plain", "eagle2_fr8": "EAGLE-2 step\n(float8 FR head)"}
    for i, key in enumerate(names):
        g = gaps[key]
        ax[0].bar(i, g["busy_us"] / 1e3, color="tab:blue", label="kernels busy" if i == 0 else None)
        ax[0].bar(i, g["idle_us"] / 1e3, bottom=g["busy_us"] / 1e3, color="tab:gray",
                  label="idle (under the profiler's slower host)" if i == 0 else None)
    ax[0].set_xticks(range(2), list(names.values()))
    ax[0].set_ylabel("ms per step (one step from an idle device)")
    ax[0].set_title("7B shape, batch 1, under torch.profiler:\nthe extra time is kernel time")
    ax[0].legend(fontsize=8)
    drafters = ["P-EAGLE", "DFlash", "DSpark"]
    x = range(len(drafters))
    ax[1].bar([i - 0.2 for i in x], [fold[d]["fold off ms/step median"] for d in drafters], 0.4,
              label="fold off (3 replays a step)")
    ax[1].bar([i + 0.2 for i in x], [fold[d]["fold on ms/step median"] for d in drafters], 0.4,
              label="fold on (1 replay a step)")
    for i, d in enumerate(drafters):
        ratio = fold[d]["on/off (median of per-call ratios)"]
        ax[1].text(i + 0.2, fold[d]["fold on ms/step median"] + 0.02, f"x{ratio:.3f}", ha="center", fontsize=8)
    ax[1].set_xticks(list(x), drafters)
    ax[1].set_ylabel("ms per step (median of 18 calls)")
    ax[1].set_title("fixture, random heads: the update folded\ninto the verify step (interleaved A/B)")
    ax[1].legend(fontsize=8)
    sps = {4: tps["gpt-fast SpS K=4"], 8: tps["gpt-fast SpS K=8"]}
    methods = [("SpS K=4", 4), ("SpS K=8", 8), ("prompt lookup K=10", 8), ("EAGLE-2", 8), ("EAGLE-3", 8),
               ("P-EAGLE", 8), ("P-EAGLE chain K=4", 4), ("P-EAGLE tree mc_sim_7b_63", 8), ("DFlash", 8),
               ("DFlash chain K=4", 4), ("DFlash tree mc_sim_7b_63", 8), ("DSpark", 8), ("DSpark chain K=4", 4),
               ("DSpark tree mc_sim_7b_63", 8), ("Medusa", 8)]
    ratios = [tps[f"specdec fast {m}"] / sps[k] for m, k in methods]
    ax[2].barh(range(len(methods)), ratios, color=["tab:green" if r > 1 else "tab:red" for r in ratios])
    ax[2].axvline(1.0, color="k", lw=0.8)
    ax[2].set_yticks(range(len(methods)), [m.replace(" mc_sim_7b_63", " (63-node)") for m, _ in methods],
                     fontsize=8)
    ax[2].invert_yaxis()
    ax[2].set_xlabel("tokens/s / gpt-fast SpS at the same K (K=8 where none)")
    ax[2].set_title("fixture beside gpt-fast, one process\n(H200, bf16, batch 1, 3 of 8 prompts timed)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "session30.png"), dpi=110)


if __name__ == "__main__":
    main()
