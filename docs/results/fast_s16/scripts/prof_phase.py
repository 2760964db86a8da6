"""Session 14: session 13's 7B step profile (phases, kernels); env ROWS = batch, SKINNY = linear_skinny's rows,
FR = the head's draft vocabulary (FR-Spec, session 22; default the full one); FP8=1: the head's linears and lm_head
rounded to float8 (specdec.nn.quantize_fp8_, session 23)."""
import os
import sys

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
if os.environ.get("FR"):  # the lm_head cut to FR random target ids, as bench_fast_7b's fast_spec_fr row
    head.restrict_vocab(torch.randperm(32000, generator=torch.Generator().manual_seed(2))[:int(os.environ["FR"])]
                        .sort().values)
if os.environ.get("FP8"):  # session 23: the head on float8 weights
    from specdec.nn import quantize_fp8_
    quantize_fp8_(head.eval().requires_grad_(False))
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

PHASES = []


def wrap(obj, name):
    f = getattr(obj, name)

    def g(*a, **k):
        if not PHASES:
            return f(*a, **k)
        torch.cuda.synchronize()
        with torch.profiler.record_function("PH_" + name):
            out = f(*a, **k)
            torch.cuda.synchronize()
        return out
    setattr(obj, name, g)


for obj, name in ((drafter, "propose"), (drafter, "update"), (adapter, "forward_commit")):
    wrap(obj, name)
state = prefill(adapter, ids, drafter=drafter).state
for _ in range(6):
    state = step(adapter, state, drafter=drafter, num_drafts=6, sync=False).state
torch.cuda.synchronize()
from torch.autograd import DeviceType  # noqa: E402

N = 10
PHASES.append(1)
ACTS = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=ACTS) as p:
    for _ in range(N):
        state = step(adapter, state, drafter=drafter, num_drafts=6, sync=False).state
    torch.cuda.synchronize()
evs = list(p.events())
ranges = [(e.name[3:], e.time_range.start, e.time_range.end) for e in evs if e.name.startswith("PH_")
          and e.device_type != DeviceType.CUDA]
kern = [(e.name, e.time_range.start, e.time_range.end) for e in evs if e.device_type == DeviceType.CUDA
        and not e.name.startswith("PH_")]
by = {}
for name, s, e in kern:
    ph = next((r[0] for r in ranges if r[1] <= s <= r[2]), "other")
    by.setdefault(ph, []).append((name, s, e))
TOP = int(os.environ.get("TOP", "45"))
for ph, ks in by.items():
    prof = kernel_summary(ks, N, top=TOP)
    span = sum(r[2] - r[1] for r in ranges if r[0] == ph) / N
    print(f"== {ph}: kernels/step {prof['kernels_per']}, GPU busy {prof['gpu_busy_us_per']} us, "
          f"host range {span:.0f} us")
    for row in prof["top"]:
        print("   ", row)
