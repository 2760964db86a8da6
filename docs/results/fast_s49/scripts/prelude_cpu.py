"""Session 49 (CPU proxy): the host's time in a fast-path step before its first kernel-launching op, the part of a
step that the 7B gate (each step timed alone from an idle device) sees as idle device time; then a cProfile of that
part of the EAGLE-2 step. The tiny float32 Llama of ``examples/profile_fast_step.py``, its captured functions and
kernels stubbed (``device_work_stubbed``). Usage: python prelude_cpu.py (from the repository root)."""
import cProfile
import pstats
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, "examples")
import profile_fast_step as P  # noqa: E402

import specdec  # noqa: E402
from specdec.graphs import GraphedDrafter  # noqa: E402

G = sys.modules["specdec.generate"]  # the module (specdec.generate is also the function)
REAL_STEP = G.step
NO_KERNEL = {"empty", "empty_strided", "view", "_unsafe_view", "reshape", "as_strided", "unsqueeze", "squeeze",
             "expand", "t", "transpose", "permute", "slice", "select", "detach", "alias", "unbind", "split",
             "split_with_sizes", "narrow", "lift_fresh", "new_empty", "new_empty_strided", "_reshape_alias",
             "view_as", "numel", "sym_size", "sym_stride", "is_same_size", "result_type", "chunk", "diagonal",
             "movedim", "flatten", "unflatten", "expand_as", "contiguous", "resolve_conj", "resolve_neg",
             "empty_like", "unfold"}


def launches(func) -> bool:
    return func.__name__.split(".")[0] not in NO_KERNEL


class FirstOp(TorchDispatchMode):
    """Calls ``on_first()`` at the first op that would launch a kernel after ``arm()``."""

    def __init__(self, on_first):
        super().__init__()
        self.on_first, self.armed = on_first, False

    def arm(self):
        self.armed = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.armed and launches(func):
            self.armed = False
            self.on_first()
        return func(*args, **(kwargs or {}))


def drafter_for(model, method: str):
    if method == "plain":
        return None
    return GraphedDrafter(P._bare_drafter(model, method), capture=P._saved_outputs_capture, device_types=("cpu",))


def preludes(model, ids, method: str) -> tuple[float, float]:
    """Median us per step: (before the first launching op, the whole step), device work stubbed."""
    rows, mark = [], {}
    mode = FirstOp(lambda: mark.__setitem__("first", time.perf_counter()))

    def timed(*args, **kwargs):
        mark.clear()
        t0 = time.perf_counter()
        mode.arm()
        with mode:
            out = REAL_STEP(*args, **kwargs)
        t1 = time.perf_counter()
        rows.append((mark.get("first", t1) - t0, t1 - t0))
        return out
    G.step = timed
    try:
        drafter = drafter_for(model, method)
        with P.device_work_stubbed():
            for _ in range(3):
                rows.clear()
                specdec.generate(model, ids, drafter=drafter, max_new_tokens=200, eos_token_id=[], fast=True)
    finally:
        G.step = REAL_STEP
    return (1e6 * statistics.median(r[0] for r in rows[10:]), 1e6 * statistics.median(r[1] for r in rows[10:]))


def profile_prelude(model, ids, method: str = "eagle2", top: int = 25) -> None:
    prof = cProfile.Profile()
    mode = FirstOp(prof.disable)

    def profiled(*args, **kwargs):
        mode.arm()
        with mode:
            prof.enable()
            out = REAL_STEP(*args, **kwargs)
            if mode.armed:
                prof.disable()
                mode.armed = False
        return out
    G.step = profiled
    try:
        drafter = drafter_for(model, method)
        with P.device_work_stubbed():
            specdec.generate(model, ids, drafter=drafter, max_new_tokens=400, eos_token_id=[], fast=True)
    finally:
        G.step = REAL_STEP
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main() -> None:
    model = P.tiny_llama()
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(0))
    for method in ("plain", "eagle2"):
        before, whole = preludes(model, ids, method)
        print(f"{method}: before the first launch {before:.1f} us, the step's host work {whole:.1f} us")
    profile_prelude(model, ids)


if __name__ == "__main__":
    main()
