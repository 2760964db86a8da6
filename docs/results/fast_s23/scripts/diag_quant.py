"""Session 23: where quantize_fp8_rows (the kernel) and quantize_fp8_rows_ref differ on the GPU."""
import torch

from specdec.kernels.fp8 import quantize_fp8_rows, quantize_fp8_rows_ref

for rows, k in [(61, 4096), (7, 8192), (16, 1000)]:
    g = torch.Generator(device="cuda").manual_seed(rows + k)
    x = torch.randn(rows, k, device="cuda", generator=g, dtype=torch.bfloat16)
    q, s = quantize_fp8_rows(x)
    rq, rs = quantize_fp8_rows_ref(x)
    cq, cs = quantize_fp8_rows_ref(x.cpu())
    bad = (q.view(torch.uint8) != rq.view(torch.uint8)).nonzero()
    print(f"rows={rows} k={k}: codes differ {len(bad)}, scales differ {(s != rs).sum().item()}, "
          f"gpu ref vs cpu ref codes differ {(rq.cpu().view(torch.uint8) != cq.view(torch.uint8)).sum().item()}, "
          f"kernel vs cpu ref {(q.cpu().view(torch.uint8) != cq.view(torch.uint8)).sum().item()}")
    for r, c in bad[:6].tolist():
        v = x[r, c].float().item() * (448.0 / float(rs[r].double() * 448.0))
        print(f"   x={x[r, c].item()!r} scale k={s[r].item()!r} r={rs[r].item()!r} v~{v!r} "
              f"kernel={q[r, c].float().item()} ref={rq[r, c].float().item()} cpu={cq[r, c].float().item()}")
    sb = (s != rs).nonzero().flatten()[:3].tolist()
    for r in sb:
        print(f"   scale row {r}: kernel {s[r].item()!r} ref {rs[r].item()!r} amax {x[r].float().abs().max().item()!r}")
