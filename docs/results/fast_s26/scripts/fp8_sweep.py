"""Session 26: the float8 draft head's products (10 rows: an EAGLE-2 level; 7: an update) as a chain of dependent
launches, the default launch configuration against a sweep (64- and 32-output programs, K split in 1, 2 or 4).

Each chain: 16 copies of the head's matrix (L2-cold), each link a small PDL kernel making the next rows,
``quantize_fp8_rows``, then the product; us per link (the ``base`` chain, without the product, is subtracted in the
last column).

    python docs/results/fast_s26/scripts/fp8_sweep.py --out $OUT/fp8_sweep.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(__file__))

from chain_sweep import HEAD, ew, graph_us  # noqa: E402

SHAPES = {**HEAD, "lm": (32000, 4096)}  # the head's full lm_head too (EAGLE-1 without FR-Spec)

from specdec.kernels.fp8 import _fp8_product, fp8_linear_config, quantize_fp8_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 7])
    ap.add_argument("--deadline", type=float, default=200.0)
    ap.add_argument("--shapes", nargs="+", default=list(HEAD), help=f"of {list(SHAPES)}")
    args = ap.parse_args()
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for name in args.shapes:
        n, k = SHAPES[name]
        ws = [(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen).to(torch.float8_e4m3fn),
               torch.rand(n, device="cuda") + 0.5) for _ in range(16)]
        for rows in args.rows:
            x0 = torch.randn(rows, max(n, k), device="cuda", dtype=torch.bfloat16, generator=gen)

            def chain(cfg, product=True):
                def run():
                    x = x0
                    for w8, sc in ws:
                        a = ew(x, k, 0)
                        q, s = quantize_fp8_rows(a)
                        x = _fp8_product(q, s, w8, sc, None, torch.bfloat16, rows, n, k, cfg) if product else a
                    return x
                return run
            row = {"base": graph_us(chain(None, False), len(ws)), "default": graph_us(chain(None), len(ws))}
            row["default_cfg"] = list(fp8_linear_config(rows, n, k))
            for bn, bk, split, stages in itertools.product((32, 64), (128, 256), (1, 2, 4), (3, 4, 5)):
                if time.time() - t0 > args.deadline or k % (split * bk):
                    continue
                cfg = (bn, bk, split, 4, stages)
                try:
                    row[str(cfg)] = graph_us(chain(cfg), len(ws))
                except Exception as err:  # noqa: BLE001 - a configuration the compiler refuses
                    print(name, cfg, "failed", str(err)[:100], flush=True)
            sweep = {key: v for key, v in row.items() if key.startswith("(")}
            best = min(sweep, key=sweep.get) if sweep else None
            res[f"{name} {rows}"] = dict(row, best=best)
            prod = lambda v: v - row["base"]  # noqa: E731
            print(f"{name:8s} rows {rows:2d}: base {row['base']:5.1f}  default {row['default']:5.1f} "
                  f"({n * k / prod(row['default']) / 1e6:4.2f} TB/s)  best {best} {sweep.get(best, 0):5.1f} "
                  f"({n * k / prod(sweep.get(best, 1e9)) / 1e6:4.2f} TB/s)  [{time.time() - t0:.0f}s]", flush=True)
        ws = None  # noqa: F841
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
