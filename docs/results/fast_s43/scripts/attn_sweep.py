"""Session 43: tree attention's launches swept again, with 128- and 256-key tiles (session 39's H100 sweep had 32- and
64-key tiles only): (1) the 7B batch-1 verify, 61 nodes in a 64 bucket over 573 live of 1,216 slots (as session
39); (2) an EAGLE head's tree level at the 7B shape, 10 nodes over a 1,024-slot head cache (no ``kv_end``: the head
attends over its whole cache under a mask). Keys L2-cold (32 layers' tensors cycled), CUDA-graph replays
(``captured_time_us``). Prints us per call, the plan first.

    python docs/results/fast_s43/scripts/attn_sweep.py OUT.json
"""
import itertools
import json
import sys

import torch

from specdec.kernels.tree_attention import _tree_attention_triton, tree_attention_launch, tree_attention_ref
from specdec.kernels.tuning import captured_time_us

dev, dt = "cuda", torch.bfloat16
out_path = sys.argv[1] if len(sys.argv) > 1 else "attn_sweep.json"
results = {}
low = torch.finfo(dt).min


def case(name, H, S, M, live, tree, kv_end, grid):
    L = 32
    torch.manual_seed(0)
    ks = [torch.randn(1, H, S, 128, device=dev, dtype=dt) for _ in range(L)]
    vs = [torch.randn(1, H, S, 128, device=dev, dtype=dt) for _ in range(L)]
    qs = [torch.randn(1, M, H, 128, device=dev, dtype=dt).transpose(1, 2) for _ in range(L)]
    mask = torch.full((1, 1, M, S), low, device=dev, dtype=dt)
    pre = live - tree
    mask[..., :pre] = 0.0
    anc = torch.rand(M, tree, device=dev) < 0.3
    anc[:min(M, tree), :min(M, tree)].fill_diagonal_(True)
    lo = pre if kv_end else S - 1 - tree  # a head's scratch sits at the end of its cache
    mask[..., lo:lo + tree] = torch.where(anc, 0.0, low).to(dt)
    end = torch.tensor([live], device=dev) if kv_end else None
    ref = tree_attention_ref(qs[0], ks[0], vs[0], mask, kv_end=end)

    def bench(**cfg):  # fused_merge=None: the library's default (session 44 passes it)
        err = (_tree_attention_triton(qs[0], ks[0], vs[0], mask, None, kv_end=end, **cfg).float()
               - ref.float()).abs().max().item()
        us = captured_time_us(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end, **cfg)
                                       for i in range(L)], 3, replays=10) / L
        return us, err

    rows = [(*bench(), "plan", tree_attention_launch(H, M, S, 128))]
    for cfg in grid:
        bm, ns, ts, w, st, *fused = cfg  # session 44: a sixth field, the merge fused or not
        try:
            us, err = bench(block_m=bm, num_splits=ns, tile_s=ts, num_warps=w, num_stages=st,
                            **({"fused_merge": fused[0]} if fused else {}))
        except Exception as exc:  # noqa: BLE001
            print("  fail", cfg, type(exc).__name__, str(exc)[:80], flush=True)
            continue
        rows.append((us, err, "sweep", cfg))
    rows.sort(key=lambda r: r[0])
    print(f"== {name} (us per call)", flush=True)
    for us, err, note, cfg in rows[:15] + [r for r in rows[15:] if r[2] != "sweep"]:
        print(f"   {us:6.2f} us  {cfg} {note} err={err:.4f}", flush=True)
    for ts in (64, 128, 256):
        sub = [r for r in rows if r[2] == "sweep" and r[3][2] == ts]
        if sub:
            print(f"   best with {ts}-key tiles: {sub[0][0]:.2f} us {sub[0][3]}", flush=True)
    results[name] = [dict(us=r[0], err=r[1], note=r[2], cfg=r[3]) for r in rows]
    json.dump(results, open(out_path, "w"), indent=1)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    case("verify, batch 1: 61 nodes, 573 live of 1216", 32, 1216, 64, 573, 61, True,
         itertools.product((32, 64), (1, 2, 3), (64, 128, 256), (4, 8), (1, 2)))
    case("head level, batch 1: 10 nodes over a 1024-slot cache", 32, 1024, 10, 640, 50, False,
         itertools.product((16,), (2, 4, 8), (64, 128, 256), (4, 8), (1, 2)))
