"""Session 24: tree attention (the plan's launch, split + merge) at the 7B verify shape against the live keys:
fixed cost against cost per key (32 layers' caches, CUDA-graph replays); SDPA for one query beside it."""
import torch
import torch.nn.functional as F

from specdec.kernels.tree_attention import _tree_attention_triton, tree_attention_launch

dev, dt = "cuda", torch.bfloat16
H, S, d, L, M = 32, 1216, 128, 32, 64
torch.manual_seed(0)
ks = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
vs = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
qs = [torch.randn(1, M, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(L)]
q1 = [torch.randn(1, H, 1, d, device=dev, dtype=dt) for _ in range(L)]


def timed(run, reps=20):
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps / L


print("live | plan | tree attention us (plan) | splits 1 | SDPA one query us")
for live in (64, 128, 256, 384, 573, 1024):
    mask = torch.zeros(1, 1, M, S, device=dev, dtype=dt)
    end = torch.tensor([live], device=dev)
    plan = tree_attention_launch(H, M, S, d)
    t = timed(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end) for i in range(L)])
    t1 = timed(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end, num_splits=1)
                        for i in range(L)])
    m1 = torch.zeros(1, 1, 1, live, device=dev, dtype=dt)
    sd = timed(lambda: [F.scaled_dot_product_attention(q1[i], ks[i][:, :, :live], vs[i][:, :, :live], attn_mask=m1)
                        for i in range(L)])
    print(f"{live} | {plan} | {t:.2f} | {t1:.2f} | {sd:.2f}", flush=True)
