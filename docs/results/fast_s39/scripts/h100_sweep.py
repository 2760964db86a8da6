"""Session 39: the 7B batch-1 verify's two extra costs on this card (an H100 in session 39's call A: the verify
forward 6.36 ms busy against the plain step's 5.19, twice the H200's +0.54 ms). (1) tree attention, 61 nodes in a
64 bucket over 573 live of 1,216 slots (keys L2-cold, 32 layers per graph replay), the plan against a sweep of
launches, and SDPA's one query (the plain step); (2) the 64-row linears on cuBLASLt / cuBLAS against one-row GEMVs
(16 distinct weights per shape, L2-cold, graph replays). Prints us per layer / per linear. (As run in call B its
``timed`` was a local copy of the same method: one eager call, a CUDA graph, the best of 3 x 10 replays; it now calls
specdec.kernels.tuning.captured_time_us, which landed after.)"""
import itertools
import json
import sys

import torch
import torch.nn.functional as F

from specdec.kernels import linear_rows
from specdec.kernels.skinny import _linear_skinny_triton
from specdec.kernels.tree_attention import _tree_attention_triton, tree_attention_launch, tree_attention_ref
from specdec.kernels.tuning import captured_time_us

dev, dt = "cuda", torch.bfloat16
out_path = sys.argv[1] if len(sys.argv) > 1 else "h100_sweep.json"
PART = sys.argv[2] if len(sys.argv) > 2 else "all"
results = {}


def timed(run, per):
    """us per launch of ``run``'s ``per`` launches, as CUDA-graph replays (session 39's tuning timer)."""
    return captured_time_us(run, 3, replays=10) / per


if PART in ("all", "attn"):
    H, S, d, live, M, tree, L = 32, 1216, 128, 573, 64, 61, 32
    torch.manual_seed(0)
    ks = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
    vs = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
    qs = [torch.randn(1, M, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(L)]
    low = torch.finfo(dt).min
    mask = torch.full((1, 1, M, S), low, device=dev, dtype=dt)
    pre = live - tree
    mask[..., :pre] = 0.0
    anc = torch.rand(M, tree, device=dev) < 0.1
    anc[:tree, :tree].fill_diagonal_(True)
    mask[..., pre:live] = torch.where(anc, 0.0, low).to(dt)
    end = torch.tensor([live], device=dev)
    ref = tree_attention_ref(qs[0], ks[0], vs[0], mask, kv_end=end)

    def bench(**cfg):
        err = (_tree_attention_triton(qs[0], ks[0], vs[0], mask, None, kv_end=end, **cfg).float()
               - ref.float()).abs().max().item()
        return timed(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end, **cfg)
                              for i in range(L)], L), err

    rows = [(*bench(), "plan", tree_attention_launch(H, M, S, d)),
            (*bench(fused_merge=True), "plan, fused merge", None)]
    from specdec.kernels._triton import set_pdl
    set_pdl(False)
    rows.append((*bench(), "plan, PDL off", None))
    set_pdl(None)
    # SDPA, one query over the live keys (the plain step's attention), cuDNN where it takes it
    q1 = [torch.randn(1, H, 1, d, device=dev, dtype=dt) for _ in range(L)]
    m1 = torch.zeros(1, 1, 1, live, device=dev, dtype=dt)
    for backend in ("cudnn", "flash", "efficient"):
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
            with sdpa_kernel([b]):
                us = timed(lambda: [F.scaled_dot_product_attention(
                    q1[i], ks[i][:, :, :live], vs[i][:, :, :live], attn_mask=None if backend == "flash" else m1)
                    for i in range(L)], L)
            rows.append((us, 0.0, f"SDPA one query ({backend})", None))
        except Exception as exc:  # noqa: BLE001
            print("  sdpa", backend, type(exc).__name__, str(exc)[:80], flush=True)
    for bm, ns, ts, w, st in itertools.product((16, 32, 64), (1, 2, 3, 4), (32, 64), (4, 8), (2, 3)):
        try:
            us, err = bench(block_m=bm, num_splits=ns, tile_s=ts, num_warps=w, num_stages=st)
        except Exception as exc:  # noqa: BLE001
            print("  fail", (bm, ns, ts, w, st), type(exc).__name__, str(exc)[:80], flush=True)
            continue
        rows.append((us, err, "sweep", (bm, ns, ts, w, st)))
    rows.sort(key=lambda r: r[0])
    print("== tree attention, batch-1 verify (us per layer)", flush=True)
    for us, err, note, cfg in rows[:12] + [r for r in rows[12:] if r[2] != "sweep"]:
        print(f"   {us:6.2f} us  {cfg} {note} err={err:.4f}", flush=True)
    results["attn"] = [dict(us=r[0], err=r[1], note=r[2], cfg=r[3]) for r in rows]
    ks = vs = qs = None
    torch.cuda.empty_cache()

if PART in ("all", "gemm"):
    shapes = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008),
              "lm_head": (32000, 4096)}
    out = {}
    print("== linears (us per linear; 16 weights cycled)", flush=True)
    for name, (n, k) in shapes.items():
        W = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(16 if name != "lm_head" else 6)]
        per = len(W)
        row = {}
        for rows_ in (61, 64):
            x = torch.randn(rows_, k, device=dev, dtype=dt)
            for lib in ("cublaslt", "cublas"):
                torch.backends.cuda.preferred_blas_library(lib)
                row[f"{rows_} {lib}"] = timed(lambda: [F.linear(x, w) for w in W], per)
        torch.backends.cuda.preferred_blas_library("cublaslt")
        x64 = torch.randn(64, k, device=dev, dtype=dt)
        best = (1e9, None)
        for cfg in itertools.product((64, 128), (64, 128), (1, 2, 4), (4, 8), (3, 5)):
            try:
                us = timed(lambda: [_linear_skinny_triton(x64, w, None, cfg) for w in W], per)
            except Exception as exc:  # noqa: BLE001
                print("  skinny fail", cfg, type(exc).__name__, str(exc)[:60], flush=True)
                continue
            best = min(best, (us, cfg))
        row["64 skinny best"] = best[0]
        row["skinny cfg"] = best[1]
        x1 = torch.randn(1, k, device=dev, dtype=dt)
        row["1 gemv"] = timed(lambda: [linear_rows(x1, w) for w in W], per)
        gb = n * k * 2 / 1e9
        print(f"   {name:8s} " + "  ".join(f"{kk}: {v:6.1f} ({gb / v * 1e3:.2f} TB/s)" if kk != "skinny cfg" else f"{v}"
                                     for kk, v in row.items()),
              flush=True)
        out[name] = row
        W = None
        torch.cuda.empty_cache()
    results["gemm"] = out
json.dump(results, open(out_path, "w"), indent=1)
