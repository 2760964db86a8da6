"""Session 30: where the 7B step's device sits idle. The fast plain step and one EAGLE-2 step (float8 FR-Spec head,
60-node tree of depth 6) run one at a time from an idle device (as bench_fast_7b times them) under torch.profiler;
per step: the device span (first kernel start to last kernel end), busy time, idle time, and the idle gaps
classified by the kernels on either side. Writes gaps.json beside a text report (stdout)."""
import json
import os
import sys

import torch
from torch.autograd import DeviceType

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_fp8_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402

OUT = os.environ.get("OUT", ".")
N = int(os.environ.get("STEPS", "8"))
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, dt)
kept = torch.randperm(32000, generator=torch.Generator().manual_seed(2))[:8192].sort().values
torch.manual_seed(1)
head = Eagle1Head.from_target(model, draft_vocab=kept)
drafter = recipes.eagle2(quantize_fp8_(head.eval().requires_grad_(False)), **B.TREE)
ids = torch.randint(0, 32000, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
capacity = capacity_for(512, 40 * 7, 128)


def kind(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name.lower() or "cutlass" in name.lower():
        return "cublas"
    if name.startswith("_"):
        return name.split("_kernel")[0]
    if name.startswith("Memcpy") or name.startswith("Memset"):
        return name.split(" (")[0]
    return "torch:" + name.split("<")[0].split("(")[0].replace("void at::native::", "")[:40]


def profile(name, run):
    for _ in range(4):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(N):
            with torch.profiler.record_function("STEP"):
                run()
                torch.cuda.synchronize()
    evs = list(p.events())
    steps = sorted((e.time_range.start, e.time_range.end) for e in evs if e.name == "STEP"
                   and e.device_type != DeviceType.CUDA)
    kern = sorted((e.time_range.start, e.time_range.end, e.name) for e in evs if e.device_type == DeviceType.CUDA
                  and e.name != "STEP")
    pairs, spans, busys, leads, big = {}, [], [], [], []
    for s0, s1 in steps:
        ks = [k for k in kern if s0 <= k[0] <= s1]
        if not ks:
            continue
        spans.append(ks[-1][1] - ks[0][0])
        leads.append(ks[0][0] - s0)
        busy, end = 0.0, ks[0][0]
        for i, (a, b, n) in enumerate(ks):
            busy += max(0.0, b - max(a, end))
            if i:
                gap = a - end
                if gap > 0:
                    key = f"{kind(ks[i - 1][2])} -> {kind(n)}"
                    c, t = pairs.get(key, (0, 0.0))
                    pairs[key] = (c + 1, t + gap)
                    if gap > 4:
                        big.append((round(gap, 1), i, kind(ks[i - 1][2]), kind(n)))
            end = max(end, b)
        busys.append(busy)
    n = len(spans)
    rep = dict(steps=n, kernels_per=round(sum(1 for k in kern if steps[0][0] <= k[0]) / n, 1),
               span_us=round(sum(spans) / n, 1), busy_us=round(sum(busys) / n, 1),
               idle_us=round((sum(spans) - sum(busys)) / n, 1), lead_us=round(sum(leads) / n, 1),
               pairs=sorted(((k, round(c / n, 1), round(t / n, 1)) for k, (c, t) in pairs.items()),
                            key=lambda r: -r[2])[:30],
               big=sorted(big, key=lambda r: -r[0])[:40])
    print(f"== {name}: {rep['kernels_per']} kernels/step, span {rep['span_us']} us, busy {rep['busy_us']}, "
          f"idle {rep['idle_us']}, lead (host to first kernel) {rep['lead_us']}")
    for row in rep["pairs"]:
        print("   ", row)
    print("   gaps > 4 us (gap, kernel index, before, after):")
    for row in rep["big"][:25]:
        print("     ", row)
    return rep


res = {}
res["plain"] = profile("fast plain", B.specdec_step(StaticAdapter(model, capacity=capacity), ids, sync=False))
res["eagle2_fr8"] = profile("EAGLE-2 fr8", B.specdec_step(StaticAdapter(model, head.feature_layers, capacity=capacity),
                                                          ids, drafter, B.TREE["depth"], sync=False))
with open(os.path.join(OUT, "gaps.json"), "w") as f:
    json.dump(res, f, indent=1)
