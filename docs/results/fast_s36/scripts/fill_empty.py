"""pytest plugin (``-p fill_empty``): ``torch.empty`` fills new tensors (NaN, or the largest integer), so that a read
of memory nobody wrote fails the same way every time (session 36's debugging)."""
import torch

torch.use_deterministic_algorithms(True, warn_only=True)
torch.utils.deterministic.fill_uninitialized_memory = True
