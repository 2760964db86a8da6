"""Session 25: is the 7B batch-1 EAGLE-2 step (float8 FR-Spec head) bound by the host? Per step: the host's time to
issue it (wall clock around step(), no sync), the device's time for it alone (events, then a sync, as
bench_fast_7b) and queued (8 steps back to back), with programmatic dependent launch as the environment says."""
import statistics
import sys
import time

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.kernels._triton import pdl_enabled  # noqa: E402
from specdec.nn import quantize_fp8_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402

dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
model = B.build_target(B.LLAMA2_7B, dev, dt)
torch.manual_seed(1)
kept = torch.randperm(32000, generator=torch.Generator().manual_seed(2))[:8192].sort().values
head = Eagle1Head.from_target(model, draft_vocab=kept)
drafter = recipes.eagle2(quantize_fp8_(head.eval().requires_grad_(False)), **B.TREE)
ids = torch.randint(0, 32000, (1, 512), device=dev, generator=torch.Generator(device=dev).manual_seed(1))
capacity = capacity_for(512, 200 * (B.TREE["depth"] + 1), 128)
rows = {}
for name, make in (("plain", lambda: B.specdec_step(StaticAdapter(model, capacity=capacity), ids, sync=False)),
                   ("eagle2_fr8", lambda: B.specdec_step(StaticAdapter(model, head.feature_layers, capacity=capacity),
                                                         ids, drafter, B.TREE["depth"], sync=False))):
    fn = make()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    host, alone = [], []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t = time.perf_counter()
        fn()
        host.append(1e3 * (time.perf_counter() - t))
        e.record()
        e.synchronize()
        alone.append(s.elapsed_time(e))
    queued = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(8):
            fn()
        e.record()
        e.synchronize()
        queued.append(s.elapsed_time(e) / 8)
    rows[name] = (statistics.median(host), statistics.median(alone), statistics.median(queued))
    del fn
    torch.cuda.empty_cache()
print(f"pdl={pdl_enabled()}  (ms per step: host issue / device alone / device queued x8)")
for name, (h, a, q) in rows.items():
    print(f"  {name:12s} host {h:6.3f}  alone {a:6.3f}  queued {q:6.3f}")
