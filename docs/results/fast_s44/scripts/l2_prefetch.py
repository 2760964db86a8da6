"""Session 44: can weights be streamed into L2 while a latency-bound stretch runs, so that the next product reads them
from L2? For each matrix of the 7B EAGLE head (float8, 10 rows) and two of the verify's (bf16, 64 rows, skinny
kernel): the product's time after an L2 flush (cold), right after a first product (warm), and after a spin of T us
with and without an L2 prefetch of its weights issued before the spin (per-line ``prefetch.global.L2::evict_last``
or ``cp.async.bulk.prefetch.L2``). Events around the product only; a 512 MB write before each rep flushes L2 and keeps
the host ahead.

    python docs/results/fast_s44/scripts/l2_prefetch.py
"""
import json
import sys

import torch
import triton
import triton.language as tl

from specdec.kernels.fp8 import FP8_DTYPE, linear_fp8
from specdec.kernels.skinny import linear_skinny


@triton.jit
def _pf_lines(ptr, n_bytes, sink, PER: tl.constexpr):
    """Each program: PER lines of 128 B from pid * PER * 128."""
    pid = tl.program_id(0)
    offs = (pid * PER + tl.arange(0, PER)).to(tl.int64) * 128
    inside = (offs < n_bytes).to(tl.int32)
    r = tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptr + offs, inside], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + pid, tl.sum(r, axis=0))


@triton.jit
def _pf_bulk(ptr, n_bytes, sink, CHUNK: tl.constexpr, THREADS: tl.constexpr):
    """Each program: THREADS chunks of CHUNK bytes, one bulk prefetch per thread."""
    pid = tl.program_id(0)
    offs = (pid * THREADS + tl.arange(0, THREADS)).to(tl.int64) * CHUNK
    size = tl.minimum(tl.maximum(n_bytes - offs, 0), CHUNK).to(tl.int32)
    r = tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + pid, tl.sum(r, axis=0))


sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")


def prefetch(t: torch.Tensor, n_bytes: int, kind: str):
    b = t.view(torch.uint8).view(-1)
    n_bytes = min(n_bytes, b.numel())
    if kind == "lines":
        per = 256
        _pf_lines[(triton.cdiv(n_bytes, per * 128),)](b, n_bytes, sink, PER=per, num_warps=4)
    else:
        chunk, threads = 4096, 128
        _pf_bulk[(triton.cdiv(n_bytes, chunk * threads),)](b, n_bytes, sink, CHUNK=chunk, THREADS=threads,
                                                           num_warps=4)


flush_buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
_props = torch.cuda.get_device_properties(0)
CLK = _props.clock_rate * 1e3 if hasattr(_props, "clock_rate") else 1.98e9  # the spin counts cycles


def spin_us(us: float):
    if us > 0:
        torch.cuda._sleep(int(us * 1e-6 * CLK))


def timed(fn, pre, reps=30):
    out = []
    for _ in range(reps):
        torch.cuda._sleep(int(400e-6 * CLK))  # the host gets ahead: nothing below waits for a launch
        flush_buf.fill_(1)
        pre()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        out.append((a, b))
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e3 for a, b in out)
    return ts[len(ts) // 2]


# the spin's real length
def spin_len(us):
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    flush_buf.fill_(1)
    a.record()
    spin_us(us)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3


print("device", torch.cuda.get_device_name(), "clock", CLK, flush=True)
spin_len(10)
print("spin 10 us ->", round(spin_len(10), 2), "us; spin 40 ->", round(spin_len(40), 2), flush=True)
torch.manual_seed(0)
mats = {
    "head fc 4096x8192 fp8": ("fp8", 4096, 8192, 10),
    "head qkv 12288x4096 fp8": ("fp8", 12288, 4096, 10),
    "head o 4096x4096 fp8": ("fp8", 4096, 4096, 10),
    "head gate_up 22016x4096 fp8": ("fp8", 22016, 4096, 10),
    "head down 4096x11008 fp8": ("fp8", 4096, 11008, 10),
    "head lm_head 8192x4096 fp8": ("fp8", 8192, 4096, 10),
    "verify o_proj 4096x4096 bf16": ("bf16", 4096, 4096, 64),
    "verify qkv 12288x4096 bf16": ("bf16", 12288, 4096, 64),
}
res = {}
for name, (kind, n, k, rows) in mats.items():
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    if kind == "fp8":
        w = (torch.randn(n, k, device="cuda") * 0.1).to(FP8_DTYPE)
        ws = torch.ones(n, device="cuda")
        fn = lambda: linear_fp8(x, w, ws)  # noqa: E731
    else:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        fn = lambda: linear_skinny(x, w)  # noqa: E731
    mb = w.numel() * w.element_size()
    fn()
    torch.cuda.synchronize()
    row = {"MB": mb / 1e6, "cold": timed(fn, lambda: None), "warm": timed(fn, fn)}
    for T in (5, 10, 20, 40):
        row[f"spin{T}"] = timed(fn, lambda: spin_us(T))
        for pk in ("lines", "bulk"):
            for cap in (16 << 20, 32 << 20, 1 << 40):
                try:
                    row[f"pf_{pk}_{cap >> 20 if cap < 1 << 40 else 'all'}_spin{T}"] = timed(
                        fn, lambda: (prefetch(w, cap, pk), spin_us(T)))
                except Exception as exc:  # noqa: BLE001
                    row[f"pf_{pk}_err"] = str(exc)[:200]
    res[name] = row
    print(f"== {name}: {mb / 1e6:.1f} MB  cold {row['cold']:.2f}  warm {row['warm']:.2f} us", flush=True)
    for T in (5, 10, 20, 40):
        cells = " ".join(f"{pk}/{c}={row.get(f'pf_{pk}_{c}_spin{T}', float('nan')):.2f}"
                         for pk in ("lines", "bulk") for c in (16, 32, "all"))
        print(f"   spin {T:2d}: none {row[f'spin{T}']:.2f} | {cells}", flush=True)
    if "pf_lines_err" in row or "pf_bulk_err" in row:
        print("   errors:", row.get("pf_lines_err"), row.get("pf_bulk_err"), flush=True)
json.dump(res, open(sys.argv[1] if len(sys.argv) > 1 else "l2_prefetch.json", "w"), indent=1)
