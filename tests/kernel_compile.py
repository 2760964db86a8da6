"""Compiling the Triton kernels for the GPU on a machine without one.

The CPU suite runs the kernels under Triton's interpreter, which accepts code the GPU compiler refuses (a module
constant read inside a kernel, a construct the code generator lacks). Such an error used to surface only on the
device machine. Here every kernel launch under the interpreter is recorded (:func:`install_recorder`: the kernel,
its arguments' types, its constexprs and launch options), and at the end of the test session a few recorded
variants of each kernel (one per combination of branch flags and float dtypes, at most :data:`PER_KERNEL`, and
the smallest once more with programmatic dependent launch on, ``PDL=True`` and ``2``, ``3`` with a weight prefetch
for the products, and with inline PTX on, ``ASM=True``,
branches the interpreter never runs) are
compiled for an H100 / H200 (``sm_90``) in a child process without the interpreter (:func:`compile_specs`), where
the kernels are real ``JITFunction`` s. A failure names the kernel and the compiler's message.

``python tests/kernel_compile.py SPECS.pkl`` compiles a pickled list of specs (what the child runs).
"""
from __future__ import annotations

import importlib
import inspect
import os
import pickle
import subprocess
import sys
import tempfile
from typing import NamedTuple

import torch

#: Variants compiled per kernel (the recorded launches differ mostly in block sizes, which change no code path).
PER_KERNEL = 3

#: The architecture compiled for: the device machine's H200.
TARGET = ("cuda", 90, 32)

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
           torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv"}


class KernelSpec(NamedTuple):
    """One launch as the compiler takes it.

    Attributes:
        module, name: where the kernel is defined (a ``@triton.jit`` function at module level).
        signature: parameter name -> Triton type (``"*bf16"``, ``"i32"``, ``"fp32"``, ``"constexpr"``).
        constexprs: parameter name -> value, for the ``constexpr`` ones.
        options: ``num_warps`` / ``num_stages`` of the launch.
    """

    module: str
    name: str
    signature: dict
    constexprs: dict
    options: dict

    def key(self) -> tuple:
        return (self.module, self.name, tuple(self.signature.items()),
                tuple((k, repr(v)) for k, v in self.constexprs.items()), tuple(sorted(self.options.items())))

    def branch(self) -> tuple:
        """What selects code paths: the non-integer constexprs (flags, dtypes) and the float pointer types."""
        flags = tuple((k, repr(v)) for k, v in self.constexprs.items() if not isinstance(v, int) or isinstance(v, bool))
        floats = tuple(t for t in self.signature.values() if t.startswith("*") and t[1] in "fb")
        return self.module, self.name, flags, floats

    def size(self) -> int:
        """The product of the integer constexprs (block sizes): the smallest variant of a branch compiles fastest."""
        out = 1
        for v in self.constexprs.values():
            if isinstance(v, int) and not isinstance(v, bool):
                out *= max(abs(v), 1)
        return out


def spec_of(fn, args: tuple, kwargs: dict) -> KernelSpec:
    """The :class:`KernelSpec` of launching the Python kernel function ``fn`` with ``args`` / ``kwargs``."""
    params = list(inspect.signature(fn).parameters.values())
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    values = dict(zip([p.name for p in params], args))
    values.update({k: v for k, v in kwargs.items() if k not in options})
    signature, constexprs = {}, {}
    for p in params:
        v = values.get(p.name, p.default)
        if "constexpr" in str(p.annotation) or v is None:
            signature[p.name], constexprs[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            signature[p.name] = "*" + _DTYPES[v.dtype]
        elif isinstance(v, bool):
            signature[p.name] = "i1"
        elif isinstance(v, int):
            signature[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
        elif isinstance(v, float):
            signature[p.name] = "fp32"
        else:
            raise TypeError(f"kernel {fn.__name__}: argument {p.name} of type {type(v).__name__} has no Triton type")
    return KernelSpec(fn.__module__, fn.__name__, signature, constexprs, options)


_RECORDED: dict = {}


def install_recorder() -> bool:
    """Record every interpreted kernel launch of this process (returns whether the interpreter is there to patch)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    run = interpreter.InterpretedFunction.run
    if getattr(run, "_specdec_recorder", False):
        return True

    def recording_run(self, *args, grid, warmup, **kwargs):
        if self.fn.__module__.startswith("specdec."):
            spec = spec_of(self.fn, args, kwargs)
            _RECORDED.setdefault(spec.key(), spec)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    recording_run._specdec_recorder = True
    interpreter.InterpretedFunction.run = recording_run
    return True


def recorded() -> list[KernelSpec]:
    """The launches recorded so far, distinct."""
    return list(_RECORDED.values())


def select(specs: list[KernelSpec], per_kernel: int = PER_KERNEL) -> list[KernelSpec]:
    """The smallest variant (:meth:`KernelSpec.size`) of each branch combination (:meth:`KernelSpec.branch`), at
    most ``per_kernel`` per kernel, the smallest first."""
    best: dict = {}
    for spec in specs:
        b = spec.branch()
        if b not in best or spec.size() < best[b].size():
            best[b] = spec
    out, count = [], {}
    for spec in sorted(best.values(), key=lambda s: (s.module, s.name, s.size())):
        n = count.get((spec.module, spec.name), 0)
        if n < per_kernel:
            out.append(spec)
            count[(spec.module, spec.name)] = n + 1
        if n == 0 and spec.constexprs.get("PDL") is False:  # the interpreter never runs the PDL branch: compile it
            for pdl in (True, 2):  # one kernel ahead, early (the default)
                out.append(spec._replace(constexprs={**spec.constexprs, "PDL": pdl},
                                         options={**spec.options, "launch_pdl": True}))
            if "PREFETCH" in spec.constexprs:  # a product asking L2 for its weights before its own wait
                out.append(spec._replace(constexprs={**spec.constexprs, "PDL": 3, "PREFETCH": 512},
                                         options={**spec.options, "launch_pdl": True}))
        if n == 0 and spec.constexprs.get("ASM") is False:  # nor a kernel's inline-PTX branch (GPU only)
            out.append(spec._replace(constexprs={**spec.constexprs, "ASM": True}))
    return out


def compile_specs(specs: list[KernelSpec], timeout: float = 600.0) -> list[str]:
    """Compile ``specs`` for :data:`TARGET` in a child process without the interpreter; returns one message per
    failure (``[]``: all compiled). Raises ``RuntimeError`` when the child itself cannot run the compiler."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "specs.pkl")
        with open(path, "wb") as f:
            pickle.dump([tuple(s) for s in specs], f)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root, os.path.dirname(os.path.abspath(__file__)),
                                             env.get("PYTHONPATH", "")])
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")
        done = subprocess.run([sys.executable, os.path.abspath(__file__), path], env=env, capture_output=True,
                              text=True, timeout=timeout)
        failures = [line[len("FAIL "):] for line in done.stdout.splitlines() if line.startswith("FAIL ")]
        if done.returncode != 0 and not failures:
            raise RuntimeError(f"the kernel compiler did not run (exit {done.returncode}): {done.stderr[-2000:]}")
        return failures


def _compile_all(path: str) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with open(path, "rb") as f:
        specs = [KernelSpec(*s) for s in pickle.load(f)]
    target = GPUTarget(*TARGET)
    failed = 0
    for spec in specs:
        fn = getattr(importlib.import_module(spec.module), spec.name)
        try:
            triton.compile(ASTSource(fn=fn, signature=spec.signature, constexprs=spec.constexprs), target=target,
                           options=spec.options)
        except Exception as err:  # noqa: BLE001 - every failure is reported, one line each
            failed += 1
            message = " | ".join(str(err).splitlines()[-6:])
            print(f"FAIL {spec.module}.{spec.name} constexprs={spec.constexprs} options={spec.options}: "
                  f"{type(err).__name__}: {message[:1500]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_compile_all(sys.argv[1]))
