"""Session 33: the CPU proxy of a fast step (examples/profile_fast_step.py) with the graphed drafters reading the
verify outputs in place (``GraphedDrafter.in_place``, the default) and copying them (``in_place=False``).

    python docs/results/fast_s33/scripts/cpu_proxy.py on|off
"""
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
import profile_fast_step as P  # noqa: E402

from specdec.graphs import GraphedDrafter  # noqa: E402

flag = sys.argv[1] == "on"
init = GraphedDrafter.__init__


def _init(self, *args, **kwargs):
    kwargs.setdefault("in_place", flag)
    init(self, *args, **kwargs)


GraphedDrafter.__init__ = _init
torch.manual_seed(0)
model = P.tiny_llama()
ids = torch.randint(3, 97, (1, 12), generator=torch.Generator().manual_seed(0))
for method in ("eagle2", "medusa", "peagle", "lookup"):
    ops = P.per_step(model, ids, method)
    outside = {k: round(v, 2) for k, v in sorted(ops["outside ops"].items(), key=lambda kv: -kv[1]) if v > 0.01}
    host = P.host_ms_per_step(model, ids, method)
    print(f"in_place={sys.argv[1]:3s} {method:7s} outside {ops['outside']:5.1f}  host ms {host:.4f}  {outside}")
