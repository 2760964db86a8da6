"""pytest plugin (``-p triton_kernels``, with ``TRITON_INTERPRET=1``): every op of ``specdec.kernels`` runs its Triton
kernel under the interpreter on CPU tensors, so the CPU tests exercise the kernels the GPU runs (session 36)."""
from specdec.kernels import _dispatch

_dispatch.set_kernel_mode("triton")
