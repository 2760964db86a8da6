"""Session 12: tree_attention vs SDPA (cuDNN, as in captured steps) and topk_rows on a 32k vocabulary, in graphs."""
import torch

from specdec.kernels import topk_rows, topk_rows_ref, tree_attention, tree_attention_ref
from specdec.nn.attention import fixed_shape_attention, masked_sdpa_kernel


def replay_us(fn, reps=200):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps / 10


print("shape (B, H, M, S, d)            sdpa(cudnn) us   tree kernel us   max err")
for B, H, M, S, d in ((1, 5, 64, 512, 64), (1, 5, 16, 512, 64), (1, 32, 64, 1216, 128), (1, 32, 16, 1216, 128),
                      (4, 32, 64, 1216, 128)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, M, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H, S, d, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = torch.zeros(B, 1, M, S, device="cuda", dtype=torch.bfloat16)
    mask[..., S - 100:] = torch.finfo(torch.bfloat16).min
    with fixed_shape_attention(), masked_sdpa_kernel():
        t_ref = replay_us(lambda a=(q, k, v, mask): tree_attention_ref(*a))
    t_ker = replay_us(lambda a=(q, k, v, mask): tree_attention(*a))
    err = (tree_attention(q, k, v, mask).float() - tree_attention_ref(q, k, v, mask).float()).abs().max().item()
    print(f"{str((B, H, M, S, d)):32s} {t_ref:14.1f} {t_ker:16.1f} {err:9.4f}")
x = torch.randn(10, 32000, device="cuda")
print(f"topk [10, 32000] k=10: sort {replay_us(lambda: topk_rows_ref(x, 10)):.1f} us, torch.topk "
      f"{replay_us(lambda: torch.topk(x, 10)):.1f} us, topk_rows {replay_us(lambda: topk_rows(x, 10)):.1f} us; "
      f"equal: {torch.equal(topk_rows(x, 10)[1], topk_rows_ref(x, 10)[1])}")
