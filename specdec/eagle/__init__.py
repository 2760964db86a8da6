"""The EAGLE family: EAGLE-1 / EAGLE-3 heads, static and dynamic (EAGLE-2) trees, checkpoint loading.

A method is a recipe, a head plus a tree policy::

    import specdec as sd
    from specdec import eagle

    head = eagle.load_eagle_head("path/or/hub-id", target)       # EAGLE-1 or EAGLE-3, any public format
    drafter = eagle.EagleDrafter(head, eagle.DynamicTree(total_tokens=60, depth=6, top_k=10))
    out = sd.generate(target, input_ids, drafter=drafter, max_new_tokens=128)

Training lives in :mod:`specdec.training` (``train_eagle1``, ``train_eagle3``).

References:
    EAGLE arXiv 2401.15077; EAGLE-2 arXiv 2406.16858; EAGLE-3 arXiv 2503.01840.
"""
from .checkpoints import export_speculators, load_eagle_head, save_eagle_head
from .drafter import EagleDrafter, EagleState, SampledTree, StaticTree, eagle1, eagle2, eagle3
from .dynamic_tree import DynamicTree, grow_dynamic_tree, grow_dynamic_tree_ref
from .heads import (
    Eagle1Head,
    Eagle3Head,
    EagleConfig,
    HeadCache,
    check_draft_vocab,
    default_feature_layers,
    target_dims,
)

__all__ = [
    "Eagle1Head",
    "Eagle3Head",
    "EagleConfig",
    "HeadCache",
    "EagleDrafter",
    "EagleState",
    "StaticTree",
    "SampledTree",
    "DynamicTree",
    "eagle1",
    "eagle2",
    "eagle3",
    "grow_dynamic_tree",
    "grow_dynamic_tree_ref",
    "load_eagle_head",
    "save_eagle_head",
    "export_speculators",
    "check_draft_vocab",
    "default_feature_layers",
    "target_dims",
]
