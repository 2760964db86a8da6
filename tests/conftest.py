"""Test-wide settings: the tiny models are launch-bound, so one intra-op thread is fastest and keeps parallel
pytest runs on a 2-core machine from oversubscribing it."""
import torch

torch.set_num_threads(1)
