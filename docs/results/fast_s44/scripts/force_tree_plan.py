"""Session 44: examples/bench_fast_7b.py with the verify's tree attention launched as ``TREE_PLAN`` says
(``BLOCK_M,num_splits,BLOCK_S,num_warps,num_stages,fused_merge``) for calls of 64 queries (the batch-1 verify);
every other call (the head's levels) keeps its plan.
    TREE_PLAN=64,9,64,4,1,0 python docs/results/fast_s44/scripts/force_tree_plan.py BENCH_ARGS..."""
import os
import sys

sys.path.insert(0, "examples")
import bench_fast_7b  # noqa: E402

import specdec.kernels  # noqa: E402,F401

ta = sys.modules["specdec.kernels.tree_attention"]
bm, ns, ts, w, st, fu = (int(v) for v in os.environ["TREE_PLAN"].split(","))
original_launch, original_run = ta.tree_attention_launch, ta._tree_attention_triton


def launch(rows_heads, queries, keys, head_dim=128, **kw):
    if queries == 64:
        return bm, ns, ts, w, st
    return original_launch(rows_heads, queries, keys, head_dim, **kw)


def run(q, k, v, mask, scale, block_s=None, **kw):
    if q.shape[2] == 64 and kw.get("fused_merge") is None:
        kw["fused_merge"] = bool(fu)
    return original_run(q, k, v, mask, scale, block_s, **kw)


ta.tree_attention_launch, ta._tree_attention_triton = launch, run
print("forced verify tree attention plan", (bm, ns, ts, w, st), "fused merge", bool(fu), flush=True)
bench_fast_7b.main(sys.argv[1:])
