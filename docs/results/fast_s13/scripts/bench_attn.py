"""Session 13: tree_attention plans (one launch over query blocks / split keys + merge), with and without kv_end.

Call 4's script, lint-cleaned after the run (loop variables bound, session 12's replay_us imported).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "fast_s12", "scripts"))
from bench_attn import replay_us  # noqa: E402  (session 12's: CUDA-graph replays of 10 calls)

from specdec.kernels import tree_attention_plan, tree_attention_ref
from specdec.kernels.tree_attention import _tree_attention_triton
from specdec.nn.attention import fixed_shape_attention, masked_sdpa_kernel

CONFIGS = [("plan", None, None), ("m64x1", 64, 1), ("m16x1", 16, 1), ("m32x1", 32, 1), ("m16x2", 16, 2),
           ("m64x4", 64, 4), ("m64x8", 64, 8), ("m16x4", 16, 4)]
print("shape (B, H, M, S, d, end)       sdpa   nokvend " + " ".join(f"{n:>7s}" for n, _, _ in CONFIGS)
      + "  plan  maxerr")
for B, H, M, S, d, end in ((1, 5, 64, 512, 64, 300), (1, 32, 64, 1216, 128, 620),
                           (1, 32, 16, 1216, 128, 620), (1, 32, 10, 700, 128, 600), (4, 32, 64, 1216, 128, 620),
                           (16, 32, 64, 1216, 128, 620)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, M, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = torch.zeros(B, 1, M, S, device="cuda", dtype=torch.bfloat16)
    mask[..., end:] = torch.finfo(torch.bfloat16).min
    kv_end = torch.tensor([end], device="cuda")
    with fixed_shape_attention(), masked_sdpa_kernel():
        t_ref = replay_us(lambda a=(q, k, v, mask): tree_attention_ref(*a))
    t_old = replay_us(lambda a=(q, k, v, mask): _tree_attention_triton(*a, None))
    times, err = [], 0.0
    ref = tree_attention_ref(q, k, v, mask).float()
    for _, bm, ns in CONFIGS:
        f = (lambda bm=bm, ns=ns, a=(q, k, v, mask), e=kv_end: _tree_attention_triton(*a, None, kv_end=e,
                                                                                        block_m=bm, num_splits=ns))
        times.append(replay_us(f))
        err = max(err, (f().float() - ref).abs().max().item())
    print(f"{str((B, H, M, S, d, end)):32s} {t_ref:6.1f} {t_old:8.1f} " + " ".join(f"{t:7.1f}" for t in times)
          + f"  {tree_attention_plan(B * H, M, S)} {err:.4f}")
