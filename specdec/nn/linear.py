"""Linear layers built without touching the global RNG.

``nn.Linear`` draws its Kaiming initialisation from torch's global generator as it is constructed. The library
never reads the global RNG (a caller's seeded stream must not shift because a head was built), so its layers are
built here with zero weights, and their owner (a head) initialises them from its own ``torch.Generator`` or loads
a checkpoint over them.
"""
from __future__ import annotations

import torch
from torch import nn


def zero_linear(in_features: int, out_features: int, *, bias: bool, device=None,
                dtype: torch.dtype | None = None) -> nn.Linear:
    """An ``nn.Linear`` whose weight (and bias) are zeros, built without drawing from the global RNG.

    The module is constructed on the meta device (where ``reset_parameters`` draws nothing), given real storage
    (``to_empty``) and zeroed, so a layer nobody initialises is deterministic rather than garbage.

    Args:
        in_features: input width.
        out_features: output width.
        bias: give the layer a bias.
        device: where to allocate (default: torch's default device).
        dtype: parameter dtype (default: torch's default dtype).

    Returns:
        The ``nn.Linear`` (weight Shape ``[out_features, in_features]``, bias Shape ``[out_features]``).

    Example:
        >>> state = torch.random.get_rng_state()
        >>> layer = zero_linear(4, 3, bias=True)
        >>> torch.equal(state, torch.random.get_rng_state()), int(layer.weight.count_nonzero())
        (True, 0)
    """
    layer = nn.Linear(in_features, out_features, bias=bias, device="meta", dtype=dtype)
    layer = layer.to_empty(device=torch.get_default_device() if device is None else device)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.zero_()
    return layer
