"""Session 46: examples/bench_fast_7b.py with the 4-bit products launched as int4_sweep.py's best configuration per
(matrix, group) instead of int4_linear_config's default (a timing of the picks in the step).

    python docs/results/fast_s46/scripts/force_int4_cfg.py SWEEP.json BENCH_ARGS...
"""
import ast
import json
import sys

sys.path.insert(0, "examples")
import bench_fast_7b  # noqa: E402

from specdec.kernels import int4  # noqa: E402

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
          "lm_fr": (8192, 4096), "fc": (4096, 8192)}
sweep = json.load(open(sys.argv[1]))
best = {}
for name, row in sweep.items():
    for group in (128, 64, 32):
        keys = [key for key in row if key.startswith(f"g{group} ")]
        if keys and name in SHAPES:
            pick = min(keys, key=row.get)
            best[SHAPES[name] + (group,)] = tuple(ast.literal_eval(pick.split(" ", 1)[1]))
print("picks:", best, flush=True)
default = int4.int4_linear_config


def picked(rows, n, k, group=128):
    return best.get((n, k, group)) or default(rows, n, k, group)


int4.int4_linear_config = picked
bench_fast_7b.main(sys.argv[2:])
