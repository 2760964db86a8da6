"""Test-wide settings: the tiny models are launch-bound, so one intra-op thread is fastest and keeps parallel
pytest runs on a 2-core machine from oversubscribing it."""
import os

import torch

torch.set_num_threads(1)

# Without a GPU, specdec.kernels' Triton kernels run under the interpreter; triton reads this when the kernels are
# created (on import of specdec.kernels), so it is set here, before any test module imports specdec.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
