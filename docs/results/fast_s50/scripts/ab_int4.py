"""Session 50: the 4-bit head's launch settings timed *inside* the 7B EAGLE-2 step, in one process, alternating
rounds (so that the process's own speed, which moves the gate by ~2% between processes, is the same for every
variant). Each measurement builds a fresh drafter (its graphs captured with the variant's launches) and a fresh
static adapter, as bench_fast_7b.py's fast_spec_fr4 column does (batch 1, context 512, FR-Spec 8,192, group 128,
median of REPS steps from an idle device after 3 warm-ups). Variants: the launch tuple of int4_linear_config
(BLOCK_N, SPLIT, num_warps, num_stages, UNROLL) replaced, or SPECDEC_PREFETCH changed.
Also tree attention's launch plans (the batch-1 verify's, a head level's), the verify's prefetch and the split
products' in-launch sum. Env: HEAD=fp8 (the float8 head), QUEUED=N (N steps back to back per timed run), REPS.
Usage: python ab_int4.py [ROUNDS] [variant ...]"""
import os
import statistics
import sys

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

import specdec.kernels.int4 as I4  # noqa: E402
import specdec.kernels.skinny  # noqa: E402,F401
import specdec.kernels.tree_attention  # noqa: E402,F401
from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_fp8_, quantize_int4_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402

LIB = I4.int4_linear_config


def split_rule(target, bn=64, warps=4, stages=3, unroll=1):
    def cfg(rows, n, k, group=128):
        programs = -(-n // bn)
        split = 1 if programs >= target else min(8, -(-target // programs))
        return bn, max(1, min(split, -(-k // 256))), warps, stages, unroll * max(1, 128 // group)
    return cfg


ta = sys.modules["specdec.kernels.tree_attention"]
sk = sys.modules["specdec.kernels.skinny"]
ATT = ta.tree_attention_launch
REPLACED = [0]  # launches whose plan a variant replaced (printed per round: 0 means the variant did nothing)


def att(verify=None, head=None):
    """tree_attention_launch with the batch-1 verify's plan (64 queries) and / or a head level's plan (< 32
    queries, 8 warps, 128-key tiles) replaced; ``head`` may be a function of the library's plan."""
    def launch(rows_heads, queries, keys, head_dim=128, **kw):
        plan = ATT(rows_heads, queries, keys, head_dim, **kw)
        if verify is not None and queries > 32 and plan == (32, 2, 64, 8, 3):
            REPLACED[0] += 1
            return verify
        if head is not None and queries <= 32 and plan[2:] == (128, 8, 1):
            REPLACED[0] += 1
            return head(plan)
        return plan
    return launch


# name -> (int4 config function, tree_attention_launch, environment, split fixup)
VARIANTS = {
    "lib": (LIB, ATT, {}, False),
    "sp528": (split_rule(528), ATT, {}, False),
    "sp132": (split_rule(132), ATT, {}, False),
    "st4": (split_rule(264, stages=4), ATT, {}, False),
    "u2": (split_rule(264, unroll=2), ATT, {}, False),
    "u2st2": (split_rule(264, stages=2, unroll=2), ATT, {}, False),
    "bn128w8": (split_rule(264, bn=128, warps=8), ATT, {}, False),
    "pf0": (LIB, ATT, {"SPECDEC_PREFETCH": "0"}, False),
    "pf128": (LIB, ATT, {"SPECDEC_PREFETCH": "128"}, False),
    "pf256": (LIB, ATT, {"SPECDEC_PREFETCH": "256"}, False),
    "pf64": (LIB, ATT, {"SPECDEC_PREFETCH": "64"}, False),
    "pf192": (LIB, ATT, {"SPECDEC_PREFETCH": "192"}, False),
    "pf512": (LIB, ATT, {"SPECDEC_PREFETCH": "512"}, False),
    "pf384": (LIB, ATT, {"SPECDEC_PREFETCH": "384"}, False),
    "vpf256": (LIB, ATT, {"SPECDEC_PREFETCH_VERIFY": "256"}, False),
    "fixup": (LIB, ATT, {}, True),
    "fmerge": (LIB, ATT, {}, "merge"),
    "h64w4s2": (LIB, att(head=lambda p: (*p[:2], 64, 4, 2)), {}, False),
    "h64w4s1": (LIB, att(head=lambda p: (*p[:2], 64, 4, 1)), {}, False),
    "h128w4s1": (LIB, att(head=lambda p: (*p[:2], 128, 4, 1)), {}, False),
    "hsplit2x": (LIB, att(head=lambda p: (p[0], min(16, 2 * p[1]), *p[2:])), {}, False),
    "hsplit.5": (LIB, att(head=lambda p: (p[0], max(1, p[1] // 2), *p[2:])), {}, False),
    "v4split": (LIB, att(verify=(32, 4, 64, 8, 3)), {}, False),
    "v3split": (LIB, att(verify=(32, 3, 64, 8, 3)), {}, False),
    "v1split": (LIB, att(verify=(32, 1, 64, 8, 3)), {}, False),
    "vm16": (LIB, att(verify=(16, 2, 64, 4, 3)), {}, False),
    "vm64": (LIB, att(verify=(64, 2, 64, 8, 3)), {}, False),
    "vm64s4": (LIB, att(verify=(64, 4, 64, 8, 3)), {}, False),
    "v6split": (LIB, att(verify=(32, 6, 64, 8, 2)), {}, False),
    "v4s32w4": (LIB, att(verify=(32, 4, 32, 4, 2)), {}, False),
    "vt32": (LIB, att(verify=(32, 2, 32, 4, 3)), {}, False),
    "vt128": (LIB, att(verify=(32, 2, 128, 8, 2)), {}, False),
    "vs2": (LIB, att(verify=(32, 2, 64, 8, 2)), {}, False),
    "vw4": (LIB, att(verify=(32, 2, 64, 4, 3)), {}, False),
}
ENV_KEYS = {k for v in VARIANTS.values() for k in v[2]}
BASE_ENV = {k: os.environ.get(k) for k in ENV_KEYS}


def apply(name):
    cfg, launch, env, fixup = VARIANTS[name]
    I4.int4_linear_config = cfg
    ta.tree_attention_launch = launch
    sk.use_split_fixup(fixup is True)
    ta.use_fused_tree_merge(fixup == "merge")
    for k in ENV_KEYS:
        value = env.get(k, BASE_ENV[k])
        os.environ.pop(k, None) if value is None else os.environ.__setitem__(k, value)


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
if os.environ.get("HEAD") == "fp8":  # the float8 head instead (fast_spec_fr8's)
    quantize_fp8_(h4.eval().requires_grad_(False))
else:
    quantize_int4_(h4.eval().requires_grad_(False), group=128)
if not TINY:  # the fused merge's counters, made before any capture (a capture cannot allocate them)
    ta._merge_counters(torch.device(dev), 1 << 16)
ids = torch.randint(0, V, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
queued = int(os.environ.get("QUEUED", "1"))  # steps queued back to back per timed run (bench_fast_7b's --queued)
capacity = capacity_for(512, (3 + reps) * queued * (B.TREE["depth"] + 1), 128)
layers = h4.feature_layers
kw = dict(warmup=3, reps=reps, device=dev, queued=queued)
res = {n: [] for n in ["plain", *names]}
for r in range(rounds):
    res["plain"].append(B.time_ms(B.specdec_step(StaticAdapter(model, capacity=capacity), ids, sync=False), **kw))
    torch.cuda.empty_cache() if not TINY else None
    for name in (names if r % 2 == 0 else names[::-1]):
        apply(name)
        drafter = recipes.eagle2(h4, **B.TREE)
        fn = B.specdec_step(StaticAdapter(model, layers, capacity=capacity), ids, drafter, B.TREE["depth"],
                            sync=False)
        res[name].append(B.time_ms(fn, **kw))
        del fn, drafter
        torch.cuda.empty_cache() if not TINY else None
    apply("lib")
    print(f"plans replaced so far: {REPLACED[0]}")
    print(f"round {r}: " + "  ".join(f"{n} {v[-1]:.3f}" for n, v in res.items()), flush=True)
print(f"{'variant':8s} {'median ms':>9s} {'/plain':>7s}  rounds")
p = statistics.median(res["plain"])
for n, v in res.items():
    print(f"{n:8s} {statistics.median(v):9.3f} {statistics.median(v) / p:7.4f}  " + " ".join(f"{x:.3f}" for x in v))
