"""Session 42: where the 7B EAGLE-2 step's device idles. Ten steps queued as generate() runs them (no sync between),
under the profiler; per step: the span from the first kernel's start to the last kernel's end, the busy time (union
of kernel intervals) and the idle gaps between consecutive kernels, summed by the pair (kernel before, kernel after).
Env: FP8=1 (the float8 head), FR=8192 (its draft vocabulary), SKINNY_ONLY=1 (the tuning never picks F.linear),
PLAIN=1 (the plain step instead)."""
import os
import sys

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.kernels import tuning  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.step import prefill, step  # noqa: E402

if os.environ.get("SKINNY_ONLY"):
    tuning.pick_fastest = lambda times, default, margin=0: min((k for k in times if k is not None), key=times.get)
dev = "cuda"
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, torch.bfloat16)
torch.manual_seed(1)
head = Eagle1Head.from_target(model)
if os.environ.get("FR"):
    head.restrict_vocab(torch.randperm(32000, generator=torch.Generator().manual_seed(2))[:int(os.environ["FR"])]
                        .sort().values)
if os.environ.get("FP8"):
    from specdec.nn import quantize_fp8_
    quantize_fp8_(head.eval().requires_grad_(False))
PLAIN = bool(os.environ.get("PLAIN"))
drafter = None if PLAIN else recipes.eagle2(head, **B.TREE)
ids = torch.randint(0, 32000, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
adapter = StaticAdapter(model, head.feature_layers, capacity=capacity_for(512, 80 * 7, 128))
K = 0 if PLAIN else 6
state = prefill(adapter, ids, drafter=drafter).state
for _ in range(6):
    state = step(adapter, state, drafter=drafter, num_drafts=K, sync=False).state
torch.cuda.synchronize()
N = 10
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    for _ in range(N):
        state = step(adapter, state, drafter=drafter, num_drafts=K, sync=False).state
    torch.cuda.synchronize()
from torch.autograd import DeviceType  # noqa: E402

ks = sorted(((e.time_range.start, e.time_range.end, e.name[:60]) for e in p.events()
             if e.device_type == DeviceType.CUDA), key=lambda t: t[0])
span = ks[-1][1] - ks[0][0]
busy, idle, end, pairs, prev = 0.0, 0.0, ks[0][0], {}, ks[0][2]
for s, e, name in ks:
    if s > end:
        gap = s - end
        idle += gap
        c, t = pairs.get((prev, name), (0, 0.0))
        pairs[(prev, name)] = (c + 1, t + gap)
    busy += max(0.0, e - max(s, end))
    if e >= end:
        end, prev = e, name
print(f"== {'plain' if PLAIN else 'eagle2'}: {len(ks) / N:.0f} kernels/step, span {span / N:.0f} us/step, "
      f"busy {busy / N:.0f}, idle {idle / N:.0f} us/step")
for (a, b), (c, t) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:int(os.environ.get("TOP", "25"))]:
    print(f"   {t / N:7.1f} us/step  {c / N:5.1f}x  {a[:45]:45s} -> {b[:45]}")
