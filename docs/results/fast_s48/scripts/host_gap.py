"""Session 48: where the 7B gate's single-step time goes between the host and the device.

For the fast plain step and the EAGLE-2 step (FR-Spec head on float8 / 4-bit weights), all in one process, as
``bench_fast_7b.py --batches 1 --draft-vocab 8192`` builds them:
- ``alone``: the bench's figure (start event, the step's launches, end event, sync; from an idle device);
- ``device``: the same with the device kept busy (``torch.cuda._sleep``) while the host queues the whole step
  after the start event's place in the stream: the step's device time without the host's launch latency;
- ``host``: the host's time inside the step call (no sync), median;
- ``queued8``: eight steps back to back per timed run, / 8.
Usage: PYTHONPATH=. python host_gap.py [reps]"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_fp8_, quantize_int4_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402


def timings(fn, reps: int, sleep_cycles: int) -> dict:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    alone, device, host, queued = [], [], [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        alone.append(s.elapsed_time(e))
        torch.cuda._sleep(sleep_cycles)  # the device busy while the host queues the step
        s.record()
        t = time.perf_counter()
        fn()
        host.append(1e3 * (time.perf_counter() - t))
        e.record()
        e.synchronize()
        device.append(s.elapsed_time(e))
        s.record()
        for _ in range(8):
            fn()
        e.record()
        e.synchronize()
        queued.append(s.elapsed_time(e) / 8)
    med = statistics.median
    return dict(alone=med(alone), device=med(device), host=med(host), queued8=med(queued))


def main(reps: int = 20):
    torch.manual_seed(0)
    model = B.build_target(B.LLAMA2_7B, "cuda", torch.bfloat16)
    torch.manual_seed(1)
    head = Eagle1Head.from_target(model)
    V = B.LLAMA2_7B["vocab_size"]
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:8192].sort().values
    drafters = {}
    for name, quantize in (("fr8", quantize_fp8_), ("fr4", lambda h: quantize_int4_(h, group=128))):
        h = Eagle1Head.from_target(model, draft_vocab=kept)
        h.load_state_dict(head.state_dict())
        drafters[name] = recipes.eagle2(quantize(h.eval().requires_grad_(False)), **B.TREE)
    ids = torch.randint(0, V, (1, 512), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    capacity = capacity_for(512, (6 + reps * 10) * 7, 128)
    layers = head.feature_layers
    rows = {}
    for _ in range(2):
        rows.setdefault("plain", []).append(timings(B.specdec_step(StaticAdapter(model, capacity=capacity), ids,
                                                                   sync=False), reps, 10_000_000))
        for name, d in drafters.items():
            rows.setdefault(name, []).append(timings(B.specdec_step(
                StaticAdapter(model, layers, capacity=capacity), ids, d, 6, sync=False), reps, 10_000_000))
            torch.cuda.empty_cache()
    print(f"{'row':6s} {'round':>5s} {'alone':>7s} {'device':>7s} {'host':>7s} {'queued8':>8s}   ratios to plain "
          f"(alone / device / queued8)")
    for rnd in range(2):
        p = rows["plain"][rnd]
        for name in rows:
            r = rows[name][rnd]
            print(f"{name:6s} {rnd:5d} {r['alone']:7.3f} {r['device']:7.3f} {r['host']:7.3f} {r['queued8']:8.3f}   "
                  f"{r['alone'] / p['alone']:.3f} / {r['device'] / p['device']:.3f} / "
                  f"{r['queued8'] / p['queued8']:.3f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
