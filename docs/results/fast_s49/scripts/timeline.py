"""Session 49: one 7B step's device timeline as the gate times it (alone, from an idle device), under the profiler.

For each run (the fast plain step; EAGLE-2 with the FR-Spec head on 4-bit / float8 weights; the 4-bit head with
EAGLE's fold), R steps, each between two tiny marker kernels (``torch.cuda._sleep``) with a sync after: the
device time from the first marker's end to the second's start is the step as the gate sees it. Per step:
- ``prelude``: device idle before the step's first kernel (the host's work before its first launch);
- ``gaps``: idle between the step's kernels, split into host-late (the next kernel's launch call began after the
  previous kernel ended: the device waited for the host) and the rest;
- ``tail``: idle after the step's last kernel until the second marker (the host still inside the step call);
- the step's launch calls (graph launches, kernels, copies) with their host time and their kernels' device span.
The profiler slows the host, so host-late figures are upper bounds. Usage: PYTHONPATH=. python timeline.py [R]"""
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, "examples")
import bench_fast_7b as B  # noqa: E402

from specdec import recipes  # noqa: E402
from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402
from specdec.heads import Eagle1Head  # noqa: E402
from specdec.nn import quantize_fp8_, quantize_int4_  # noqa: E402
from specdec.static import StaticAdapter, capacity_for  # noqa: E402
from specdec.trees import DynamicTree  # noqa: E402

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def trace(fn, steps: int) -> dict:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as p:
        for _ in range(steps):
            torch.cuda._sleep(100)
            fn()
            torch.cuda._sleep(100)
            torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    p.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(path)
    return events


def analyse(events: list) -> list[dict]:
    dev = sorted((e for e in events if e.get("cat") in DEVICE_CATS and e.get("ph") == "X"), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    marks = [i for i, e in enumerate(dev) if "spin" in e["name"].lower() or "sleep" in e["name"].lower()]
    steps = []
    for a, b in zip(marks[0::2], marks[1::2]):
        m1, m2, acts = dev[a], dev[b], dev[a + 1:b]
        t0 = m1["ts"] + m1["dur"]
        if not acts:
            continue
        gaps, end, late, other = [], acts[0]["ts"] + acts[0]["dur"], 0.0, 0.0
        for prev, e in zip(acts, acts[1:]):
            gap = e["ts"] - end
            if gap > 0:
                call = launches.get(e["args"].get("correlation"))
                is_late = call is not None and call["ts"] > end - 1.0
                late, other = late + gap * is_late, other + gap * (not is_late)
                gaps.append((gap, is_late, prev["name"][:40], e["name"][:40], call["name"] if call else "?"))
            end = max(end, e["ts"] + e["dur"])
        calls = {}
        for e in acts:
            c = e["args"].get("correlation")
            d = calls.setdefault(c, dict(call=launches.get(c, {}).get("name", "?"),
                                         host=launches.get(c, {}).get("ts", float("nan")) - t0,
                                         first=e["ts"] - t0, last=e["ts"] + e["dur"] - t0, n=0))
            d["last"] = max(d["last"], e["ts"] + e["dur"] - t0)
            d["n"] += 1
        steps.append(dict(total=m2["ts"] - t0, prelude=acts[0]["ts"] - t0, tail=m2["ts"] - end, late=late,
                          other=other, kernels=len(acts), gaps=sorted(gaps, reverse=True)[:12],
                          calls=sorted(calls.values(), key=lambda d: d["first"])))
    return steps


def main(reps: int = 7):
    torch.manual_seed(0)
    model = B.build_target(B.LLAMA2_7B, "cuda", torch.bfloat16)
    torch.manual_seed(1)
    head = Eagle1Head.from_target(model)
    V = B.LLAMA2_7B["vocab_size"]
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(2))[:8192].sort().values

    def rounded(quantize):
        h = Eagle1Head.from_target(model, draft_vocab=kept)
        h.load_state_dict(head.state_dict())
        return quantize(h.eval().requires_grad_(False))
    h4, h8 = rounded(lambda h: quantize_int4_(h, group=128)), rounded(quantize_fp8_)
    ids = torch.randint(0, V, (1, 512), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    capacity = capacity_for(512, (10 + reps) * 7 * 2, 128)
    layers = head.feature_layers
    runs = {
        "plain": lambda: B.specdec_step(StaticAdapter(model, capacity=capacity), ids, sync=False),
        "fr4": lambda: B.specdec_step(StaticAdapter(model, layers, capacity=capacity), ids,
                                      recipes.eagle2(h4, **B.TREE), 6, sync=False),
        "fr4 fold": lambda: B.specdec_step(StaticAdapter(model, layers, capacity=capacity), ids, GraphedDrafter(
            EagleDrafter(h4, DynamicTree(**B.TREE), fold=True)), 6, sync=False),
        "fr8": lambda: B.specdec_step(StaticAdapter(model, layers, capacity=capacity), ids,
                                      recipes.eagle2(h8, **B.TREE), 6, sync=False),
    }
    summary = []
    for name, make in runs.items():
        steps = analyse(trace(make(), reps))
        torch.cuda.empty_cache()
        med = {k: statistics.median(s[k] for s in steps) for k in ("total", "prelude", "tail", "late", "other")}
        summary.append((name, med, steps[0]["kernels"] if steps else 0))
        s = sorted(steps, key=lambda s: s["total"])[len(steps) // 2]  # the median step, in detail
        print(f"\n== {name}: median over {len(steps)} steps (us): " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
        print("   launch calls of the median step (host ts, device first .. last, kernels; us from the marker):")
        for c in s["calls"]:
            if c["n"] > 1 or c["last"] - c["first"] > 20 or "Graph" in c["call"]:
                print(f"     {c['call'][:28]:28s} host {c['host']:8.1f}  dev {c['first']:8.1f} .. {c['last']:8.1f}"
                      f"  n={c['n']}")
        small = [c for c in s["calls"] if not (c["n"] > 1 or c["last"] - c["first"] > 20 or "Graph" in c["call"])]
        print(f"     + {len(small)} single small launches")
        print("   largest gaps: us, host-late, previous -> next (launch call)")
        for g in s["gaps"]:
            print(f"     {g[0]:7.1f} {'LATE' if g[1] else '    '} {g[2]} -> {g[3]} ({g[4]})")
    print("\nrun        total  prelude  host-late  other-gaps  tail  kernels   (us, median step)")
    for name, m, k in summary:
        print(f"{name:9s} {m['total']:7.1f} {m['prelude']:8.1f} {m['late']:10.1f} {m['other']:11.1f} "
              f"{m['tail']:5.1f} {k:8d}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
