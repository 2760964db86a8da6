"""Session 30, call F: why the EAGLE-2 fold (EagleDrafter(fold=True)) made the 7B step slower: kernel time per step by
kernel name, the fold on against off (10 steps each under torch.profiler; float8 FR-Spec head, batch 1)."""
import os
import sys

import torch
from torch.autograd import DeviceType

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402
from bench_fast_rounds import kernel_summary  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_fp8_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402

dev = "cuda"
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, torch.bfloat16)
kept = torch.randperm(32000, generator=torch.Generator().manual_seed(2))[:8192].sort().values
torch.manual_seed(1)
head = quantize_fp8_(Eagle1Head.from_target(model, draft_vocab=kept).eval().requires_grad_(False))
ids = torch.randint(0, 32000, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
for fold in (True, False):
    drafter = recipes.eagle2(head, **B.TREE)
    drafter.drafter.fold = fold
    run = B.specdec_step(StaticAdapter(model, head.feature_layers, capacity=capacity_for(512, 40 * 7, 128)), ids,
                         drafter, B.TREE["depth"], sync=False)
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            run()
        torch.cuda.synchronize()
    ks = [(e.name, e.time_range.start, e.time_range.end) for e in p.events() if e.device_type == DeviceType.CUDA]
    prof = kernel_summary(ks, 10, top=int(os.environ.get("TOP", "22")))
    print(f"== fold {'on' if fold else 'off'}: counts {drafter.counts}, kernels/step {prof['kernels_per']}, "
          f"busy {prof['gpu_busy_us_per']} us", flush=True)
    for row in prof["top"]:
        print("   ", row, flush=True)
