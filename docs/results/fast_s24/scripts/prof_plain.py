"""Session 24: the 7B fast plain step's kernels (batch 1, context 512), to set against the EAGLE-2 step's phases
(fast_s16/scripts/prof_phase.py): what the verify forward adds over a one-token forward."""
import sys

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402
from bench_fast_rounds import kernel_summary  # noqa: E402

from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.step import prefill, step  # noqa: E402

dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, dt)
ids = torch.randint(0, 32000, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
adapter = StaticAdapter(model, capacity=capacity_for(512, 80, 128))
state = prefill(adapter, ids).state
for _ in range(6):
    state = step(adapter, state, sync=False).state
torch.cuda.synchronize()
N = 10
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    for _ in range(N):
        state = step(adapter, state, sync=False).state
    torch.cuda.synchronize()
kern = [(e.name, e.time_range.start, e.time_range.end) for e in p.events()
        if e.device_type == torch.autograd.DeviceType.CUDA]
prof = kernel_summary(kern, N, top=30)
print(f"== plain: kernels/step {prof['kernels_per']}, GPU busy {prof['gpu_busy_us_per']} us")
for row in prof["top"]:
    print("   ", row)
