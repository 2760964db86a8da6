"""Session 24: log_softmax_topk of an EAGLE-2 level (10 rows of FR-Spec's 8,192 logits, k = 10; 10 x 32,000 for the
full vocabulary) with rows cut in chunks of 4,096 (two launches) against one program per row (TOPK_CHUNK raised):
CUDA-graph replays of 32 calls on distinct inputs."""
import torch

import specdec.kernels.topk as T

dev = "cuda"
torch.manual_seed(0)


def timed(run, reps=20, calls=32):
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
    return s.elapsed_time(e) * 1e3 / reps / calls


for rows, n in ((10, 8192), (10, 32000), (1, 100), (10, 4096)):
    xs = [torch.randn(rows, n, device=dev, dtype=torch.bfloat16) for _ in range(32)]
    ref = [T.log_softmax_topk_ref(x, 10) for x in xs[:2]]
    line = [f"[{rows}, {n}]"]
    for chunk in (4096, 8192, 16384):
        T.TOPK_CHUNK = chunk
        out = [T.log_softmax_topk(x, 10) for x in xs[:2]]
        ok = all(torch.equal(a[1], b[1]) and torch.allclose(a[0], b[0], atol=1e-4) for a, b in zip(out, ref))
        us = timed(lambda: [T.log_softmax_topk(x, 10) for x in xs])
        line.append(f"chunk {chunk}: {us:.2f} us ok={ok}")
    T.TOPK_CHUNK = 4096
    print(" | ".join(line), flush=True)
