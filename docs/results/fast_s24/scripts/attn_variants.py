"""Session 24: what makes tree attention's split kernel cost ~2 us per 64-key tile at the 7B verify shape?
An experimental copy of specdec's _tree_split_kernel with switches: MASK (read the additive mask; off = every key
visible, timing only), KT (keys loaded [S, d] and transposed in registers instead of a [d, S] load), and the plan's
block sizes; the library's merge kernel after it. Keys L2-cold (32 layers' caches), CUDA-graph replays."""
import itertools

import torch
import triton
import triton.language as tl

from specdec.kernels.tree_attention import _tree_attention_triton, _tree_merge_kernel

dev, dt = "cuda", torch.bfloat16
H, S, d, L, M, live = 32, 1216, 128, 32, 64, 573
torch.manual_seed(0)
ks = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
vs = [torch.randn(1, H, S, d, device=dev, dtype=dt) for _ in range(L)]
qs = [torch.randn(1, M, H, d, device=dev, dtype=dt).transpose(1, 2) for _ in range(L)]
mask = torch.zeros(1, 1, M, S, device=dev, dtype=dt)
end = torch.tensor([live], device=dev)


@triton.jit
def _split(q_ptr, k_ptr, v_ptr, mask_ptr, end_ptr, m_ptr, l_ptr, acc_ptr, H, M, S, D, NS, scale,
           sqh, sqm, skh, sks, svh, svs, smm, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
           MASK: tl.constexpr, KT: tl.constexpr):
    bh = tl.program_id(0)
    chunk = tl.program_id(1)
    qb = tl.program_id(2)
    rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    r_in = rows < M
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + bh * sqh + rows[:, None] * sqm + dims[None, :], mask=r_in[:, None], other=0.0)
    end = tl.load(end_ptr)
    per = tl.cdiv(tl.cdiv(end, NS), 16) * 16
    lo = chunk * per
    hi = tl.minimum(lo + per, end)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        s_in = s < hi
        if KT:
            keys = tl.load(k_ptr + bh * skh + s[:, None] * sks + dims[None, :], mask=s_in[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(keys))
        else:
            keys_t = tl.load(k_ptr + bh * skh + s[None, :] * sks + dims[:, None], mask=s_in[None, :], other=0.0)
            scores = tl.dot(q, keys_t)
        scores = scores * scale
        if MASK:
            scores += tl.load(mask_ptr + rows[:, None] * smm + s[None, :], mask=r_in[:, None] & s_in[None, :],
                              other=0.0).to(tl.float32)
        scores = tl.where(s_in[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        values = tl.load(v_ptr + bh * svh + s[:, None] * svs + dims[None, :], mask=s_in[:, None], other=0.0)
        part = tl.dot(p.to(values.dtype), values)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + part
        m_i = m_new
    out = (bh * NS + chunk) * M + rows
    tl.store(m_ptr + out, m_i, mask=r_in)
    tl.store(l_ptr + out, l_i, mask=r_in)
    tl.store(acc_ptr + out[:, None] * D + dims[None, :], acc, mask=r_in[:, None])


def run_variant(q, k, v, cfg):
    bm, ns, bs, w, st, use_mask, kt = cfg
    o = torch.empty(1, M, H, d, device=dev, dtype=dt).transpose(1, 2)
    m = torch.empty(H, ns, M, device=dev)
    lsum = torch.empty(H, ns, M, device=dev)
    acc = torch.empty(H, ns, M, d, device=dev)
    _split[(H, ns, M // bm)](q, k, v, mask, end, m, lsum, acc, H, M, S, d, ns, d ** -0.5, q.stride(1), q.stride(2),
                             k.stride(1), k.stride(2), v.stride(1), v.stride(2), mask.stride(2), BLOCK_M=bm,
                             BLOCK_S=bs, BLOCK_D=d, MASK=use_mask, KT=kt, num_warps=w, num_stages=st)
    _tree_merge_kernel[(H, M)](m, lsum, acc, o, H, M, d, ns, *o.stride(), BLOCK_NS=triton.next_power_of_2(ns),
                               BLOCK_D=d)
    return o


def timed(run, reps=20):
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
        best = min(best, s.elapsed_time(e) * 1e3 / reps / L)
    return best


ref = _tree_attention_triton(qs[0], ks[0], vs[0], mask, None, kv_end=end)
lib = timed(lambda: [_tree_attention_triton(qs[i], ks[i], vs[i], mask, None, kv_end=end) for i in range(L)])
print(f"library plan: {lib:.2f} us per layer")
rows = []
for cfg in itertools.product((32, 64), (2, 4), (32, 64), (4, 8), (2, 3), (1, 0), (0, 1)):
    try:
        err = (run_variant(qs[0], ks[0], vs[0], cfg).float() - ref.float()).abs().max().item()
        us = timed(lambda: [run_variant(qs[i], ks[i], vs[i], cfg) for i in range(L)])
    except Exception as exc:  # noqa: BLE001
        print("fail", cfg, type(exc).__name__, str(exc)[:100])
        continue
    rows.append((us, cfg, err))
rows.sort()
print("(BLOCK_M, splits, BLOCK_S, warps, stages, MASK, KT)")
for us, cfg, err in rows[:20]:
    print(f"  {us:6.2f} us {cfg} err {err:.4f}")
for want in ((32, 2, 64, 8, 3, 1, 0), (32, 2, 64, 8, 3, 0, 0), (32, 2, 64, 8, 3, 1, 1), (64, 2, 64, 8, 3, 1, 0),
             (64, 4, 64, 8, 3, 1, 0), (64, 4, 64, 8, 3, 0, 0)):
    print("  ", want, [round(r[0], 2) for r in rows if r[1] == want])
