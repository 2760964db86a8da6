"""Session 16: log_softmax_topk's chunk width on the 7B head's rows ([1, 32000] root, [10, 32000] level), k = 10."""
import torch

import specdec.kernels.topk as T

dev = "cuda"
torch.manual_seed(0)
rows = {r: torch.randn(r, 32000, device=dev, dtype=torch.bfloat16) for r in (1, 10)}
want = {r: T.log_softmax_topk(x, 10) for r, x in rows.items()}
for chunk in (4096, 2048, 1024, 512):
    T.TOPK_CHUNK = chunk
    line = [f"chunk {chunk:5d}"]
    for r, x in rows.items():
        got = T.log_softmax_topk(x, 10)
        same = torch.equal(got[1], want[r][1]) and torch.allclose(got[0], want[r][0], atol=1e-5)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                T.log_softmax_topk(x, 10)
        g.replay()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        line.append(f"[{r}, 32000]: {s.elapsed_time(e) * 1e3 / 200:6.2f} us (same {same})")
    print("  ".join(line))
