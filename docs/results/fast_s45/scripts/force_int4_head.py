"""Session 45: examples/bench_fast_7b.py with the float8 head's products on 4-bit weights (int4_head.py's kernel,
sign-magnitude codes, 128 inputs per scale, call C's best launch per matrix), to time what the 4-bit head does to
the 7B step. Every float8 weight the head multiplies by (its own linears, the fused ``[q; k; v]`` / ``[gate; up]``)
is rounded to 4 bits the first time it is met (a warm-up, before any capture); products of more than 64 rows (the
head's prefill over the prompt) stay on the float8 kernel. Drafts differ from the float8 head's: a timing only.

    python docs/results/fast_s45/scripts/force_int4_head.py BENCH_ARGS...
"""
import atexit
import os
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, os.path.dirname(__file__))
import bench_fast_7b  # noqa: E402
from int4_head import int4_product, pack_int4  # noqa: E402

from specdec.kernels.fp8 import Fp8Rows  # noqa: E402
from specdec.nn import fp8 as nn_fp8  # noqa: E402
from specdec.nn import inference  # noqa: E402

#: (N, K) -> (BLOCK_N, SPLIT, num_warps, num_stages, AHEAD): call C's best sign-magnitude launch per matrix.
CONFIGS = {(12288, 4096): (128, 2, 8, 3, 0), (4096, 4096): (64, 4, 4, 3, 0), (22016, 4096): (64, 1, 4, 3, 0),
           (4096, 11008): (64, 4, 4, 3, 0), (4096, 8192): (64, 4, 4, 4, 0), (8192, 4096): (64, 4, 4, 2, 0)}
_packed: dict = {}
_calls = [0, 0]  # products on 4-bit weights, on float8 (more than 64 rows)
_float8 = inference.linear_fp8


def linear_int4(x, w8, scale, bias=None, *, config=None):
    n, k = w8.shape
    rows = x if isinstance(x, Fp8Rows) else None
    count = (x.q if rows else x).numel() // k
    if count > 64 or k % 256:
        _calls[1] += 1
        return _float8(x, w8, scale, bias, config=config)
    key = (w8.data_ptr(), n, k)
    if key not in _packed:
        assert not (w8.is_cuda and torch.cuda.is_current_stream_capturing()), "a weight first met under capture"
        _packed[key] = pack_int4(w8.float() * scale[:, None], signed=True)
    rows = rows or Fp8Rows.of(x)
    lead = rows.q.shape[:-1]
    y = int4_product(rows.q.reshape(-1, k), rows.scale.reshape(-1), *_packed[key], rows.dtype,
                     CONFIGS.get((n, k), (64, 2, 4, 3, 0)), mode=3)
    _calls[0] += 1
    return (y if bias is None else y + bias).view(*lead, n)


inference.linear_fp8 = nn_fp8.linear_fp8 = linear_int4
atexit.register(lambda: print(f"4-bit head: {len(_packed)} weights rounded; {_calls[0]} products traced on 4-bit "
                              f"weights, {_calls[1]} on float8 (prefill)", flush=True))
bench_fast_7b.main(sys.argv[1:])
