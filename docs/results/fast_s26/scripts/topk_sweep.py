"""Session 26: the draft tree's log-softmax + top-k (specdec.kernels.log_softmax_topk) with each pick one maximum
over packed (value, index) keys against the two reductions per pick, and over chunk widths.

Shapes: an EAGLE-2 level of the 7B head (``[10, 8192]`` FR-Spec, ``[10, 32000]`` full vocabulary; the fixture's
vocabulary is 8,192 too) and a root (``[1, 8192]``). Each chain: 32 calls on distinct logits in one CUDA graph
(PDL on), us per call.

    python docs/results/fast_s26/scripts/topk_sweep.py --out $OUT/topk.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(__file__))

from chain_sweep import graph_us  # noqa: E402

from specdec.kernels.topk import _topk_rows_triton, log_softmax_topk_ref  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for rows, vocab in ((10, 8192), (10, 32000), (1, 8192), (40, 8192)):
        xs = [torch.randn(rows, vocab, device="cuda", generator=gen, dtype=torch.bfloat16) * 3 for _ in range(32)]
        ref = log_softmax_topk_ref(xs[0], 10)
        row = {}
        for packed in (False, True):
            for chunk in (4096, 2048, 1024, 512):
                got = _topk_rows_triton(xs[0], 10, lse=True, packed=packed, chunk=chunk)
                assert torch.equal(got[1], ref[1]), (rows, vocab, packed, chunk)
                key = f"{'packed' if packed else 'two-reductions'} chunk={chunk}"
                row[key] = graph_us(lambda: [_topk_rows_triton(x, 10, lse=True, packed=packed, chunk=chunk)
                                             for x in xs], len(xs))
        res[f"[{rows}, {vocab}]"] = row
        print(f"[{rows}, {vocab}] " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
