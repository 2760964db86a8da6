"""The GPU compile check of the interpreted kernels (tests/kernel_compile.py): it reports what the interpreter runs
but the GPU compiler refuses, and it picks few variants per kernel."""
from __future__ import annotations

import os

import pytest
import torch
from kernel_compile import KernelSpec, compile_specs, select, spec_of

triton = pytest.importorskip("triton")
tl = triton.language

_SCALE = 448.0  # a plain module constant: the interpreter reads it inside a kernel, the GPU compiler does not


@triton.jit
def _reads_a_module_constant(x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(x_ptr + i, tl.load(x_ptr + i) * _SCALE)


@triton.jit
def _scales(x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(x_ptr + i, tl.load(x_ptr + i) * 448.0)


def _compile(specs):
    try:
        return compile_specs(specs)
    except RuntimeError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the GPU compiler cannot run here: {err}")


def test_a_kernel_only_the_interpreter_accepts_is_reported_by_name():
    x = torch.ones(16)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        _reads_a_module_constant[(1,)](x, N=16)  # the interpreter runs it
        assert torch.equal(x, torch.full((16,), 448.0))
    specs = [spec_of(_reads_a_module_constant.fn, (x,), {"N": 16}), spec_of(_scales.fn, (x,), {"N": 16})]
    assert specs[0].signature == {"x_ptr": "*fp32", "N": "constexpr"} and specs[0].constexprs == {"N": 16}
    failures = _compile(specs)
    assert len(failures) == 1, failures
    assert "_reads_a_module_constant" in failures[0] and "_SCALE" in failures[0]


def test_select_keeps_the_smallest_variant_of_each_branch_and_caps_each_kernel():
    def spec(name, flag, block, dtype="*bf16"):
        return KernelSpec("m", name, {"x": dtype, "FLAG": "constexpr", "BLOCK": "constexpr"},
                          {"FLAG": flag, "BLOCK": block}, {"num_warps": 4})
    specs = [spec("k", True, 128), spec("k", True, 32), spec("k", False, 64), spec("k", False, 64, "*fp32"),
             spec("k", None, 16), spec("j", True, 8)]
    chosen = select(specs, per_kernel=3)
    assert [(s.name, s.constexprs["FLAG"], s.constexprs["BLOCK"]) for s in chosen if s.name == "j"] == [("j", True, 8)]
    ks = [s for s in chosen if s.name == "k"]
    assert len(ks) == 3 and all(s.constexprs["BLOCK"] != 128 for s in ks)  # the smaller one of its branch
    assert ks == sorted(ks, key=KernelSpec.size)
