"""Session 50: the 4-bit head's launch settings timed *inside* the 7B EAGLE-2 step, in one process, alternating
rounds (so that the process's own speed, which moves the gate by ~2% between processes, is the same for every
variant). Each measurement builds a fresh drafter (its graphs captured with the variant's launches) and a fresh
static adapter, as bench_fast_7b.py's fast_spec_fr4 column does (batch 1, context 512, FR-Spec 8,192, group 128,
median of REPS steps from an idle device after 3 warm-ups). Variants: the launch tuple of int4_linear_config
(BLOCK_N, SPLIT, num_warps, num_stages, UNROLL) replaced, or SPECDEC_PREFETCH changed.
Usage: python ab_int4.py [ROUNDS] [variant ...]"""
import os
import statistics
import sys

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

import specdec.kernels.int4 as I4  # noqa: E402
from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_int4_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402

LIB = I4.int4_linear_config


def split_rule(target, bn=64, warps=4, stages=3):
    def cfg(rows, n, k, group=128):
        programs = -(-n // bn)
        split = 1 if programs >= target else min(8, -(-target // programs))
        return bn, max(1, min(split, -(-k // 256))), warps, stages, max(1, 128 // group)
    return cfg


VARIANTS = {
    "lib": (LIB, None),
    "sp528": (split_rule(528), None),
    "sp132": (split_rule(132), None),
    "st4": (split_rule(264, stages=4), None),
    "st2": (split_rule(264, stages=2), None),
    "bn32": (split_rule(264, bn=32), None),
    "bn32w2": (split_rule(264, bn=32, warps=2), None),
    "pf0": (LIB, "0"),
    "pf256": (LIB, "256"),
    "pf1024": (LIB, "1024"),
}

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
names = sys.argv[2:] or list(VARIANTS)
reps = int(os.environ.get("REPS", "30"))
TINY = bool(os.environ.get("TINY"))
dev = "cpu" if TINY else "cuda"
SHAPE = B.TINY if TINY else B.LLAMA2_7B
V = SHAPE["vocab_size"]
torch.manual_seed(0)
model = B.build_target(SHAPE, dev, torch.bfloat16)
torch.manual_seed(1)
head = Eagle1Head.from_target(model)
kept = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:min(8192, V // 2)].sort().values
h4 = Eagle1Head.from_target(model, draft_vocab=kept)
h4.load_state_dict(head.state_dict())
del head
quantize_int4_(h4.eval().requires_grad_(False), group=128)
ids = torch.randint(0, V, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
capacity = capacity_for(512, (3 + reps) * (B.TREE["depth"] + 1), 128)
layers = h4.feature_layers
kw = dict(warmup=3, reps=reps, device=dev)
res = {n: [] for n in ["plain", *names]}
default_pf = os.environ.get("SPECDEC_PREFETCH")
for r in range(rounds):
    res["plain"].append(B.time_ms(B.specdec_step(StaticAdapter(model, capacity=capacity), ids, sync=False), **kw))
    torch.cuda.empty_cache() if not TINY else None
    for name in (names if r % 2 == 0 else names[::-1]):
        cfg, pf = VARIANTS[name]
        I4.int4_linear_config = cfg
        if pf is None:
            os.environ.pop("SPECDEC_PREFETCH", None) if default_pf is None else os.environ.update(
                SPECDEC_PREFETCH=default_pf)
        else:
            os.environ["SPECDEC_PREFETCH"] = pf
        drafter = recipes.eagle2(h4, **B.TREE)
        fn = B.specdec_step(StaticAdapter(model, layers, capacity=capacity), ids, drafter, B.TREE["depth"],
                            sync=False)
        res[name].append(B.time_ms(fn, **kw))
        del fn, drafter
        torch.cuda.empty_cache() if not TINY else None
    I4.int4_linear_config = LIB
    print(f"round {r}: " + "  ".join(f"{n} {v[-1]:.3f}" for n, v in res.items()), flush=True)
print(f"{'variant':8s} {'median ms':>9s} {'/plain':>7s}  rounds")
p = statistics.median(res["plain"])
for n, v in res.items():
    print(f"{n:8s} {statistics.median(v):9.3f} {statistics.median(v) / p:7.4f}  " + " ".join(f"{x:.3f}" for x in v))
