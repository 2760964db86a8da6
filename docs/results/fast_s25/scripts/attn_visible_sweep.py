"""Session 25: tree attention at the 7B verify (61 nodes in a 64 bucket over 573 live of 1,216 slots, keys L2-cold,
CUDA-graph replays over the layers) and an EAGLE head's level (10 queries): the plan without and with prefix_end,
and with visible_end (the committed slots read with no mask), the prefix's tiles in the same programs as the tree's
(two loops) or in chunks apart from the tree's (``tree_chunk``: one loop per program). Ran against the kernel
as committed in f2b8be2 (call A: before visible_end was added); its ``tree_chunk`` argument was removed later."""
import itertools
import json
import sys

import torch

from specdec.kernels.tree_attention import _tree_attention_triton, tree_attention_launch, tree_attention_ref

dev, dt = "cuda", torch.bfloat16
H, S, d, live = 32, 1216, 128, 573
out_path = sys.argv[1] if len(sys.argv) > 1 else "attn_visible.json"
sys.path.insert(0, __file__.rsplit("/", 1)[0])


def case(B, M, tree, layers):
    torch.manual_seed(B)
    ks = [torch.randn(B, H, S, d, device=dev, dtype=dt) for _ in range(layers)]
    vs = [torch.randn(B, H, S, d, device=dev, dtype=dt) for _ in range(layers)]
    qs = [torch.randn(B, M, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(layers)]
    low = torch.finfo(dt).min
    mask = torch.full((B, 1, M, S), low, device=dev, dtype=dt)
    pre = live - tree
    mask[..., :pre] = 0.0
    mask[..., 7:11] = low  # holes
    anc = torch.rand(M, tree, device=dev) < 0.1
    anc[:min(M, tree), :min(M, tree)].fill_diagonal_(True)
    mask[..., pre:live] = torch.where(anc, 0.0, low).to(dt)
    return ks, vs, qs, mask, torch.tensor([live], device=dev), torch.tensor([pre], device=dev)


def timed(run, layers, reps=10):
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(3):
        s.record()
        for _ in range(reps):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / reps / layers)
    return best


results = {}
for name, B, M, tree, layers in (("verify_b1", 1, 64, 61, 32), ("verify_b4", 4, 64, 61, 16),
                                 ("verify_b16", 16, 64, 61, 8), ("head_level", 1, 10, 10, 32)):
    ks, vs, qs, mask, end, pre = case(B, M, tree, layers)
    mask[..., 7:11] = 0.0  # dense: every committed slot seen (visible_end's premise)
    ref = tree_attention_ref(qs[0], ks[0], vs[0], mask, kv_end=end)

    def bench(bound, **cfg):
        kw = dict(kv_end=end, **{bound: pre} if bound else {}, **cfg)
        err = (_tree_attention_triton(qs[0], ks[0], vs[0], mask, None, **kw).float() - ref.float()).abs().max()
        return timed(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, **kw)
                              for i in range(layers)], layers), err.item()

    rows = [(*bench(None), "plan, no prefix", tree_attention_launch(B * H, M, S, d)),
            (*bench("prefix_end"), "plan, prefix row", tree_attention_launch(B * H, M, S, d, shared_prefix=True)),
            (*bench("visible_end"), "plan, visible", tree_attention_launch(B * H, M, S, d, visible_prefix=True))]
    if name == "verify_b1":
        grid = itertools.product((32, 64), (2, 3, 4), (32, 64), (4, 8), (2, 3), (False, True))
    elif name == "head_level":
        grid = itertools.product((16,), (4, 8), (32, 64, 128), (4, 8), (1, 3), (False, True))
    else:
        grid = itertools.product((32, 64), (1, 2), (32, 64), (4,), (1, 3), (False, True))
    for bm, ns, ts, w, st, tc in grid:
        if (tc and ns == 1) or (ts == 128 and w == 4):
            continue
        try:
            us, err = bench("visible_end", block_m=bm, num_splits=ns, tile_s=ts, num_warps=w, num_stages=st,
                            tree_chunk=tc)
        except Exception as exc:  # noqa: BLE001
            print("  fail", (bm, ns, ts, w, st, tc), type(exc).__name__, str(exc)[:80], flush=True)
            continue
        rows.append((us, err, "visible, tree chunk" if tc else "visible", (bm, ns, ts, w, st)))
    rows.sort(key=lambda r: r[0])
    print(f"== {name} B={B} M={M}", flush=True)
    for us, err, note, cfg in rows[:10] + [r for r in rows[10:] if r[2].startswith("plan")]:
        print(f"   {us:6.2f} us  {cfg} {note} err={err:.4f}", flush=True)
    results[name] = [dict(us=r[0], err=r[1], note=r[2], cfg=r[3]) for r in rows]
    ks = vs = qs = None
    torch.cuda.empty_cache()
json.dump(results, open(out_path, "w"), indent=1)
