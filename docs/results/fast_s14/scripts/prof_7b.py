"""Session 14: session 13's 7B step profile (phases, kernels); env ROWS = batch, SKINNY = linear_skinny's rows."""
import os
import sys
import time

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.static import StaticAdapter, capacity_for, compiled_capture  # noqa: E402
from specdec.step import prefill, step  # noqa: E402
from specdec.trees.dynamic import DynamicTree  # noqa: E402

sys.path.insert(0, "examples")
from bench_fast_rounds import kernel_summary  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "graphs"
TREE = not (len(sys.argv) > 2 and sys.argv[2] == "notree")
from specdec.fused import decode_kernels  # noqa: E402

SKINNY = {"skinny_rows": int(os.environ["SKINNY"])} if os.environ.get("SKINNY") else {}  # call 2: skinny_kernel.py
KEEP = decode_kernels(tree_attention=TREE, **SKINNY)  # held: restored at exit
KEEP.__enter__()
MODE = MODE + (" +tree" if TREE else " sdpa") + f" rows={os.environ.get('ROWS', '1')}"
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, dt)
torch.manual_seed(1)
head = Eagle1Head.from_target(model)
ROWS = int(os.environ.get("ROWS", "1"))
ids = torch.randint(0, 32000, (ROWS, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
cap_kw = {}
if MODE.startswith("dcompile"):  # the drafter compiled, the target captured as is
    drafter = GraphedDrafter(EagleDrafter(head, DynamicTree(**B.TREE)), capture=compiled_capture())
elif MODE.startswith("compile"):
    drafter = GraphedDrafter(EagleDrafter(head, DynamicTree(**B.TREE)), capture=compiled_capture())
    cap_kw = dict(capture=compiled_capture())
else:
    drafter = recipes.eagle2(head, **B.TREE)
capacity = capacity_for(512, 80 * 7, 128)
adapter = StaticAdapter(model, head.feature_layers, capacity=capacity, **cap_kw)
log = []


def wrap(obj, name):
    f = getattr(obj, name)

    def g(*a, **k):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = f(*a, **k)
        e.record()
        log.append((name, s, e))
        return out
    setattr(obj, name, g)


for obj, name in ((drafter, "propose"), (drafter, "update"), (adapter, "forward_commit")):
    wrap(obj, name)
t0 = time.time()
state = prefill(adapter, ids, drafter=drafter).state
for _ in range(5):
    state = step(adapter, state, drafter=drafter, num_drafts=6, sync=False).state
torch.cuda.synchronize()
print(f"[{MODE}] warm-up (captures/compiles) {time.time() - t0:.1f} s", flush=True)
log.clear()
N = 30
s0, e0 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize()
t1 = time.perf_counter()
s0.record()
for _ in range(N):
    state = step(adapter, state, drafter=drafter, num_drafts=6, sync=False).state
e0.record()
torch.cuda.synchronize()
wall = (time.perf_counter() - t1) * 1e3 / N
total = s0.elapsed_time(e0) / N
parts = {}
for name, s, e in log:
    parts[name] = parts.get(name, 0.0) + s.elapsed_time(e) / N
print(f"[{MODE}] step wall {wall:.3f} ms, GPU-event span {total:.3f} ms; " +
      ", ".join(f"{k} {v:.3f}" for k, v in parts.items()) + f"; rest {total - sum(parts.values()):.3f}", flush=True)
steps = [0]


def run():
    global state
    for _ in range(10):
        state = step(adapter, state, drafter=drafter, num_drafts=6, sync=False).state


from torch.autograd import DeviceType  # noqa: E402

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    run()
    torch.cuda.synchronize()
prof = kernel_summary([(e.name, e.time_range.start, e.time_range.end) for e in p.events()
                       if e.device_type == DeviceType.CUDA], 10, top=40)
print(f"[{MODE}] kernels per step {prof['kernels_per']}, GPU busy {prof['gpu_busy_us_per']} us per step")
for row in prof["top"]:
    print("   ", row)
