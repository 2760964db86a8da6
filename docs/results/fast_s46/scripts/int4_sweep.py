"""Session 46 (calls B and C): launch configurations of the library's 4-bit product (specdec.kernels.linear_int4) per
group size, for the Llama-2-7B EAGLE head's six matrices at 10 rows, in session 26's chain of dependent launches (16
weights cycled past L2, CUDA-graph replays), against the float8 product. Call A found the 4-bit head at 64 and 32
inputs per scale no faster than float8 in the 7B step (the default launch: 64 outputs, 3 loads in flight): their
chunks load 64 / 32 bytes per weight row, half / a quarter of 128's, so more loads in flight may pay (call B: they
do not). Call C's library takes ``UNROLL`` chunks a step, every product issued before any is scaled.

    python docs/results/fast_s46/scripts/int4_sweep.py OUT.json [--deadline 240]
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import time

import torch

from specdec.kernels.fp8 import FP8_DTYPE, _fp8_product, quantize_fp8_rows
from specdec.kernels.int4 import _int4_product, int4_linear_config, pack_int4


def _chain_tools():
    """Session 26's chain tools, through session 45's loader of them (``int4_head._chain_tools``)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "fast_s45", "scripts", "int4_head.py")
    spec = importlib.util.spec_from_file_location("int4_head", path)
    proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proto)
    return proto._chain_tools()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--deadline", type=float, default=240.0)
    ap.add_argument("--rows", type=int, default=10)
    args = ap.parse_args()
    chain = _chain_tools()
    t0 = time.time()
    rows = args.rows
    res = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (n, k) in chain.HEAD.items():
        ws8 = [(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen).to(FP8_DTYPE),
                torch.rand(n, device="cuda") + 0.5) for _ in range(16)]
        x0 = torch.randn(rows, max(n, k), device="cuda", dtype=torch.bfloat16, generator=gen)

        def run(product):
            def fn():
                x = x0
                for i in range(16):
                    a = chain.ew(x, k, 0)
                    q, s = quantize_fp8_rows(a)
                    x = product(q, s, i) if product else a
                return x
            return fn
        row = {"base": chain.graph_us(run(None), 16),
               "fp8": chain.graph_us(run(lambda q, s, i: _fp8_product(q, s, *ws8[i], None, torch.bfloat16, rows, n,
                                                                      k)), 16)}
        net = lambda v: v - row["base"]  # noqa: E731
        for group in (128, 64, 32):
            ws4 = [pack_int4(torch.empty(n, k, device="cuda").normal_(0, 0.02, generator=gen), group)
                   for _ in range(16)]
            default = int4_linear_config(rows, n, k, group)
            if len(default) == 4:  # call B's library: no UNROLL
                cfgs = [default] + [(64, split, 4, stages) for split, stages in itertools.product((1, 2, 4), (3, 5, 8))]
                cfgs += [(128, split, 8, 3) for split in (1, 2)]
            else:  # call C: UNROLL chunks a step (128 // group: 128 bytes of a row a step; 1; twice that)
                unrolls = sorted({1, 128 // group, 256 // group} & {1, 2, 4})
                cfgs = [default] + [(64, split, 4, stages, u) for split, stages, u in
                                    itertools.product((1, 2, 4), (3, 4), unrolls)]
            for cfg in dict.fromkeys(cfgs):
                if time.time() - t0 > args.deadline:
                    break
                try:
                    us = chain.graph_us(run(lambda q, s, i, c=cfg, w=ws4: _int4_product(q, s, w[i], None,
                                                                                      torch.bfloat16, c)), 16)
                    row[f"g{group} {cfg}"] = us
                except Exception as err:  # noqa: BLE001 - a configuration the compiler refuses
                    print(name, group, cfg, "failed", str(err)[:100], flush=True)
            keys = [key for key in row if key.startswith(f"g{group} ")]
            best = min(keys, key=row.get, default=None)
            dflt = row.get(f"g{group} {default}")
            nan = float("nan")
            print(f"{name:8s} g{group:3d}: fp8 {net(row['fp8']):5.1f} us  default {default} "
                  f"{net(dflt) if dflt else nan:5.1f}  best {best} {net(row[best]) if best else nan:5.1f}"
                  f"  [{time.time() - t0:.0f}s]", flush=True)
        res[name] = row
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
