"""Session 47 (CPU): the torch ops inside the fast path's captured functions of one EAGLE-2 step (a tiny bf16 Llama,
every specdec kernel forced and interpreted, the head on 4-bit or float8 weights). On CUDA each such op is a torch
kernel launched without programmatic dependent launch: it waits for the kernel before it to finish, and the kernel
after it cannot be scheduled early, so each one ends the early-scheduled chain (session 47's call B: ~58 a step on
the 7B shape, ~0.2 ms of idle before them). Ops that launch nothing on a GPU (views, empty, metadata) are left out.
Usage: TRITON_INTERPRET=1 python graph_torch_ops.py [int4|fp8|none]"""
import collections
import sys
import traceback

import torch

sys.path.insert(0, "examples")
import profile_fast_step as P  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from specdec.kernels import kernel_mode  # noqa: E402

NO_KERNEL = {"empty", "empty_strided", "view", "_unsafe_view", "reshape", "as_strided", "unsqueeze", "squeeze",
             "expand", "t", "transpose", "permute", "slice", "select", "detach", "alias", "unbind", "split",
             "split_with_sizes", "narrow", "lift_fresh", "new_empty", "new_empty_strided", "_reshape_alias", "view_as",
             "numel", "sym_size", "sym_stride", "is_same_size", "result_type", "chunk", "diagonal", "movedim",
             "flatten", "unflatten", "expand_as", "contiguous", "_to_copy_noop", "resolve_conj", "resolve_neg",
             "view_as_real", "real", "empty_like", "unfold"}

run = interpreter.InterpretedFunction.run
STACK = []


def quiet_run(self, *a, **k):  # a kernel launch: its interpreter's own torch calls are not the step's ops
    STACK.append(1)
    try:
        return run(self, *a, **k)
    finally:
        STACK.pop()


interpreter.InterpretedFunction.run = quiet_run


class Where(P.OpCounter):
    def __init__(self):
        super().__init__()
        self.sites = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).replace("aten.", "")
        region = self._stack[-1]
        if not STACK and region in ("target graph", "drafter graphs", "outside") and name not in NO_KERNEL:
            if name in ("copy_", "clone", "_to_copy") and all(
                    getattr(a, "numel", lambda: 1)() == 0 for a in args if isinstance(a, torch.Tensor)):
                pass
            else:
                frames = [f for f in traceback.extract_stack()[:-1] if "/specdec/" in f.filename]
                site = " < ".join(f"{f.filename.split('/specdec/')[-1]}:{f.lineno}" for f in frames[-4:][::-1])
                self.sites[(region, name, site)] += 1
        return func(*args, **(kwargs or {}))


def main(rounding="int4"):
    model = P.tiny_llama().to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    results = []
    for new in (8, 20):
        counter = Where()
        drafter = P._bare_drafter(model, "eagle2")
        head = drafter.head if hasattr(drafter, "head") else None
        if rounding != "none" and head is not None:
            from specdec.nn import quantize_fp8_, quantize_int4_
            (quantize_int4_ if rounding == "int4" else quantize_fp8_)(head.eval().requires_grad_(False))
        from specdec.graphs import GraphedDrafter
        drafter = GraphedDrafter(drafter, capture=P._flagged_capture(counter, "drafter graphs"), device_types=("cpu",))
        with kernel_mode("triton"), P.counting(counter):
            out = P.specdec.generate(model, ids, drafter=drafter, max_new_tokens=new, eos_token_id=[], fast=True)
        results.append((counter, out.stats.num_steps))
    (c0, s0), (c1, s1) = results
    per = {k: (c1.sites[k] - c0.sites.get(k, 0)) / (s1 - s0) for k in c1.sites}
    total = sum(per.values())
    print(f"torch ops launching a kernel, inside the graphs, per step: {total:.1f} ({rounding} head)")
    for (region, name, site), n in sorted(per.items(), key=lambda kv: (kv[0][0], -kv[1])):
        if n > 0.01:
            print(f"  {n:5.2f}  {region:15s} {name:22s} {site}")


if __name__ == "__main__":
    main(*(sys.argv[1:] or ["int4"]))
