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


def test_every_kernel_starts_with_pdl_start_and_its_pdl_branch_compiles_for_the_gpu():
    """Programmatic dependent launch: each specdec kernel takes ``PDL`` and calls ``pdl_start(PDL)`` first (a kernel
    launched early must wait before it reads or writes); select() adds the ``PDL=True`` variant the interpreter
    never runs, and one real kernel compiles with it for sm_90."""
    import ast
    import importlib
    import inspect
    import pkgutil
    import textwrap

    import specdec.kernels as kernels

    found = 0
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"specdec.kernels.{info.name}")
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if not name.endswith("_kernel") or fn is None or fn.__module__ != module.__name__:
                continue
            found += 1
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            body = tree.body[0].body
            first = body[1] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body[0]
            assert ast.unparse(first) == "pdl_start(PDL)", f"{module.__name__}.{name} must call pdl_start(PDL) first"
            assert inspect.signature(fn).parameters["PDL"].default is False
            if "PREFETCH" in inspect.signature(fn).parameters:  # PDL == 3 defers the wait to the kernel itself:
                calls = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Call)]
                assert "pdl_wait(PDL)" in calls, f"{module.__name__}.{name} takes PREFETCH: it must call pdl_wait(PDL)"
                # ... before its first load or store: only the prefetch (a hint on constant weights) comes earlier
                loads = [i for i, c in enumerate(calls) if c.startswith(("tl.load", "tl.store", "skinny_", "_chunk"))]
                assert calls.index("pdl_wait(PDL)") < min(loads, default=len(calls)), name
    assert found >= 25
    from specdec.kernels.gemv import _gemv_kernel

    x = torch.ones(1, 64)
    spec = spec_of(_gemv_kernel.fn, (x, torch.ones(32, 64), x, torch.ones(1, 32), 1, 32, 64, 64, 64, 32),
                   {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 4})
    chosen = select([spec])
    assert [s.constexprs["PDL"] for s in chosen] == [False, True, 2] and chosen[1].options["launch_pdl"] is True
    assert all("PREFETCH" not in s.constexprs for s in chosen)  # the GEMV prefetches nothing
    assert _compile(chosen[1:]) == []
