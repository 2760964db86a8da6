"""Session 18: where a parallel drafter's fast-path step goes on the GPU, phase by phase (kernels, GPU busy time).

P-EAGLE's step cost ~1.6 ms against DFlash's ~0.9 ms in call J (random heads; P-EAGLE 8 levels, a 9-token verify in
the 16 bucket; DFlash block 8, 7 drafts, an 8-token verify): here both draft 8 levels (DFlash block 9), and this lists,
per phase (the drafter's ``propose`` and ``update``, the target's ``forward_commit``), the kernels per step, the GPU
busy time and the top kernels, for each drafter, after warm-up steps (graphs captured). Run from the repository root:

    python docs/results/fast_s18/scripts/prof_parallel.py FIXTURE_DIR [PEAGLE_HEAD]    # GPU; CPU: a smoke run

Phases are synchronised apart (a sync before and after each), so their sum exceeds an unprofiled step.
"""
import sys

import torch
from torch.autograd import DeviceType
from transformers import AutoModelForCausalLM

sys.path.insert(0, "examples")
from bench_fast_rounds import kernel_summary  # noqa: E402

import specdec as sd  # noqa: E402
from specdec.heads import DFlashHead, MedusaHead, PEagleHead  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.step import prefill, step  # noqa: E402

F = sys.argv[1]
dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
N, K, TOP = (10, 8, 12) if dev == "cuda" else (2, 8, 5)
target = AutoModelForCausalLM.from_pretrained(f"{F}/pycoder-18m", dtype=dtype).to(dev).eval()
torch.manual_seed(0)
makers = {
    "P-EAGLE": lambda: sd.recipes.peagle(PEagleHead.from_target(target, num_layers=2, max_drafts=K).to(dev, dtype)),
    "DFlash": lambda: sd.recipes.dflash(DFlashHead.from_target(target, block_size=K + 1, num_layers=2).to(dev, dtype)),
    "Medusa": lambda: sd.recipes.medusa(MedusaHead.from_target(target, num_heads=5).to(dev, dtype)),
}
if len(sys.argv) > 2:
    makers["P-EAGLE trained"] = lambda: sd.recipes.peagle(sd.formats.load_peagle_head(sys.argv[2], target))
ids = torch.randint(0, target.config.vocab_size, (1, 256), device=dev, generator=torch.Generator(dev).manual_seed(1))
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)


def phased(obj, name, on):
    """``obj.name`` wrapped in a profiler range (synchronised apart) while ``on`` is non-empty."""
    f = getattr(obj, name)

    def g(*a, **k):
        if not on:
            return f(*a, **k)
        sync()
        with torch.profiler.record_function("PH_" + name):
            out = f(*a, **k)
            sync()
        return out
    setattr(obj, name, g)


for label, make in makers.items():
    drafter = make()
    adapter = StaticAdapter(target, drafter.feature_layers, capacity=capacity_for(256, 40 * (K + 1), 64))
    on = []
    for obj, name in ((drafter, "propose"), (drafter, "update"), (adapter, "forward_commit")):
        phased(obj, name, on)
    state = prefill(adapter, ids, drafter=drafter).state
    for _ in range(6):  # captures
        state = step(adapter, state, drafter=drafter, num_drafts=K, sync=False).state
    sync()
    on.append(1)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(N):
            state = step(adapter, state, drafter=drafter, num_drafts=K, sync=False).state
        sync()
    events = list(prof.events())
    ranges = [(e.name[3:], e.time_range.start, e.time_range.end) for e in events
              if e.name.startswith("PH_") and e.device_type != DeviceType.CUDA]
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in events
               if e.device_type == DeviceType.CUDA and not e.name.startswith("PH_")]
    print(f"##### {label}: {N} steps, K = {K}, counts {getattr(drafter, 'counts', {})}", flush=True)
    for phase in ("propose", "update", "forward_commit"):
        span = sum(r[2] - r[1] for r in ranges if r[0] == phase) / N
        mine = [k for k in kernels if any(r[0] == phase and r[1] <= k[1] <= r[2] for r in ranges)]
        summary = kernel_summary(mine, N, top=TOP)
        print(f"== {phase}: host range {span:.0f} us, kernels/step {summary['kernels_per']}, "
              f"GPU busy {summary['gpu_busy_us_per']} us")
        for row in summary["top"]:
            print("   ", row)
