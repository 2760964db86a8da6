"""Session 16: tree attention of the 7B verify at batch 1 with the keys L2-cold (32 layers' caches, as in a step)."""
import itertools

import torch

from specdec.kernels.tree_attention import _tree_attention_triton, tree_attention_launch

dev, dt = "cuda", torch.bfloat16
B, H, M, S, d, L = 1, 32, 64, 1216, 128, 32
live = 573
torch.manual_seed(0)
qs = [torch.randn(B, M, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(L)]
ks = [torch.randn(B, H, S, d, device=dev, dtype=dt) for _ in range(L)]
vs = [torch.randn(B, H, S, d, device=dev, dtype=dt) for _ in range(L)]
mask = torch.zeros(B, 1, M, S, device=dev, dtype=dt)
tree = torch.rand(M, 61, device=dev) < 0.1  # each node sees a few tree keys and itself
tree[:61].fill_diagonal_(True)
mask[..., live - 61:live] = torch.where(tree, 0.0, torch.finfo(dt).min).to(dt)
end = torch.tensor([live], device=dev)
ref = torch.nn.functional.scaled_dot_product_attention(qs[0], ks[0][:, :, :live], vs[0][:, :, :live],
                                                       attn_mask=mask[..., :live])
default = tree_attention_launch(B * H, M, S, d)
print("default plan", default)


def bench(cfg):
    bm, ns, ts, w, st = cfg
    def run():
        for i in range(L):
            _tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end, block_m=bm, num_splits=ns,
                                   tile_s=ts, num_warps=w, num_stages=st)
    out = _tree_attention_triton(qs[0], ks[0], vs[0], mask, None, kv_end=end, block_m=bm, num_splits=ns,
                                 tile_s=ts, num_warps=w, num_stages=st)
    err = (out.float() - ref.float()).abs().max().item()
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / 20 / L, err


rows = []
for cfg in [default] + [c for c in itertools.product((32, 64), (1, 2, 3, 4, 6, 8), (64, 128), (4, 8), (1, 3))
                        if c != default]:
    try:
        us, err = bench(cfg)
    except Exception:  # noqa: BLE001
        continue
    rows.append((us, cfg, err))
rows.sort()
print("default", [r for r in rows if r[1] == default])
for r in rows[:15]:
    print(f"{r[0]:7.2f} us  (BLOCK_M, splits, tile, warps, stages)={r[1]}  err={r[2]:.4f}")
