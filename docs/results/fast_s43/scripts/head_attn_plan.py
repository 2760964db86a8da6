"""Session 43: examples/bench_fast_7b.py with tree attention's plan for few-query calls on 128-wide heads (an EAGLE
head's tree levels and updates) changed from 128-key tiles, 8 warps, 1 stage to 64-key tiles, 4 warps, 2 stages
(attn_sweep.py on the H100: a 7B head level over a 1,024-slot cache 16.3 -> 12.5 us).
    python docs/results/fast_s43/scripts/head_attn_plan.py BENCH_ARGS..."""
import runpy
import sys

import specdec.kernels.tree_attention  # noqa: F401  (the module; the package's name is the function)

ta = sys.modules["specdec.kernels.tree_attention"]

_plan = ta.tree_attention_launch


def launch(rows_heads, queries, keys, head_dim=128, **kw):
    plan = _plan(rows_heads, queries, keys, head_dim, **kw)
    return (*plan[:2], 64, 4, 2) if plan[2:] == (128, 8, 1) else plan


ta.tree_attention_launch = launch
sys.path.insert(0, "examples")
sys.argv = ["examples/bench_fast_7b.py"] + sys.argv[1:]
runpy.run_path("examples/bench_fast_7b.py", run_name="__main__")
