"""Session 47: which kernels of the 7B EAGLE-2 step are not specdec's Triton kernels (torch's, cuBLAS's: launched
without programmatic dependent launch, so each one ends the early-scheduled chain), with counts per step, busy time,
and the idle time around them. Ten steps queued as generate() runs them, under the profiler. Env: FP8=1 / INT4=G
(the head's weights), FR=8192 (its draft vocabulary), PLAIN=1 (the plain step)."""
import os
import sys

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.step import prefill, step  # noqa: E402

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
if os.environ.get("INT4"):
    from specdec.nn import quantize_int4_
    quantize_int4_(head.eval().requires_grad_(False), group=int(os.environ["INT4"]))
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

ks = sorted(((e.time_range.start, e.time_range.end, e.name) for e in p.events()
             if e.device_type == DeviceType.CUDA), key=lambda t: t[0])
span = ks[-1][1] - ks[0][0]


def ours(name):
    return name.startswith("_") and "kernel" in name


stats, end, prev_ours = {}, ks[0][0], True
busy = idle = 0.0
for s, e, name in ks:
    gap = max(0.0, s - end)
    idle += gap
    busy += max(0.0, e - max(s, end))
    key = name[:70] if not ours(name) else "(specdec triton) " + name[:50]
    c, b, g = stats.get(key, (0, 0.0, 0.0))
    stats[key] = (c + 1, b + (e - s), g + gap)
    end = max(end, e)
print(f"== {'plain' if PLAIN else 'eagle2'}: {len(ks) / N:.0f} kernels/step, span {span / N:.0f} us/step, "
      f"busy {busy / N:.0f}, idle {idle / N:.0f} us/step; early={os.environ.get('SPECDEC_PDL_EARLY', '0')}")
other = {k: v for k, v in stats.items() if not k.startswith("(specdec")}
mine = {k: v for k, v in stats.items() if k.startswith("(specdec")}
for title, d in (("not specdec's", other), ("specdec's", mine)):
    c = sum(v[0] for v in d.values()) / N
    print(f"-- {title}: {c:.0f} kernels/step, busy {sum(v[1] for v in d.values()) / N:.0f} us, "
          f"idle before them {sum(v[2] for v in d.values()) / N:.0f} us")
    for k, (c, b, g) in sorted(d.items(), key=lambda kv: -kv[1][1])[:int(os.environ.get("TOP", "40"))]:
        print(f"   {c / N:6.1f}x  busy {b / N:7.1f}  idle-before {g / N:6.1f}   {k}")

if os.environ.get("SEQ"):  # one step's kernels that are not specdec's, in order, with their neighbours
    per = len(ks) // N
    step_ks = ks[per * (N // 2): per * (N // 2 + 1)]
    print(f"-- one step's non-specdec kernels in order ({per} kernels a step): idle before, index, kernel, "
          "previous -> next")
    for i, (s, _e, name) in enumerate(step_ks):
        if not ours(name):
            gap = s - step_ks[i - 1][1] if i else 0.0
            prev = step_ks[i - 1][2][:28] if i else "-"
            nxt = step_ks[i + 1][2][:28] if i + 1 < len(step_ks) else "-"
            print(f"   {gap:6.1f} us  #{i:3d}  {name[:60]:60s}  {prev} -> {nxt}")
