"""Test-wide settings: the tiny models are launch-bound, so one intra-op thread is fastest and keeps parallel
pytest runs on a 2-core machine from oversubscribing it. Without a GPU, every kernel the tests run under Triton's
interpreter is also compiled for the GPU at the end of the session (``tests/kernel_compile.py``): an error only the
GPU compiler sees fails the run here, not on the device machine. ``SPECDEC_COMPILE_CHECK=0`` skips that step (quick
local runs)."""
import os

import pytest
import torch

torch.set_num_threads(1)

# Without a GPU, specdec.kernels' Triton kernels run under the interpreter; triton reads this when the kernels are
# created (on import of specdec.kernels), so it is set here, before any test module imports specdec.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernel_compile  # noqa: E402  (tests/ is on the path: pytest's rootdir conftest)

_CHECK = (os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") and os.environ.get("SPECDEC_COMPILE_CHECK") != "0"
          and kernel_compile.install_recorder())


@pytest.fixture(scope="session", autouse=True)
def kernels_compile_for_the_gpu():
    """After this process's tests: compile a few recorded variants of every kernel they launched for sm_90."""
    yield
    if not _CHECK:
        return
    specs = kernel_compile.select(kernel_compile.recorded())
    if not specs:
        return
    try:
        failures = kernel_compile.compile_specs(specs)
    except RuntimeError as err:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the GPU compile check could not run here: {err}")
    if failures:
        pytest.fail(f"{len(failures)} of {len(specs)} kernel variants the interpreter ran do not compile for the GPU "
                    "(sm_90):\n" + "\n".join(failures), pytrace=False)
