"""Trees of draft tokens: the compiler (tree choices -> :class:`Tree`), presets, tree algebra, and tree policies.

- :mod:`specdec.trees.core`: :func:`compile_tree`, :func:`chain_tree`, :class:`Tree` (``cu_drafts_per_level``,
  parents, depths, retrieve paths), :func:`ancestor_matrix`, the public presets.
- Tree policies (how a head's distributions become a tree each step; the :class:`TreePolicy` protocol and its
  ``expand`` callback, usable by any autoregressive head drafter): :class:`StaticTree`, :class:`SampledTree`
  (:mod:`specdec.trees.static`), :class:`DynamicTree` (EAGLE-2, :mod:`specdec.trees.dynamic`).
"""
from .core import (
    EAGLE_MC_SIM_7B_63,
    MEDUSA_MC_SIM_7B_63,
    MEDUSA_VICUNA_7B_STAGE1,
    MEDUSA_VICUNA_7B_STAGE1_ABLATION,
    MEDUSA_VICUNA_7B_STAGE2,
    MEDUSA_VICUNA_13B_STAGE1,
    MEDUSA_VICUNA_13B_STAGE2,
    MEDUSA_VICUNA_33B_STAGE1,
    MEDUSA_VICUNA_33B_STAGE2,
    MEDUSA_ZEPHYR_STAGE2,
    TREE_PRESETS,
    Tree,
    TreeChoices,
    ancestor_matrix,
    chain_tree,
    compile_tree,
    depths_from_parents,
    retrieve_paths,
    validate_parents,
)
from .dynamic import DynamicTree, ExpandFn, TreePolicy, VocabMap, grow_dynamic_tree, grow_dynamic_tree_ref
from .level import LevelTree, as_level_policy, level_tree_draft, level_tree_draft_ref
from .optimize import (
    RankAcceptance,
    comb_tree,
    count_rank_hits,
    expected_accept_length,
    measure_rank_acceptance,
    optimal_tree,
    rank_candidates,
    sequoia_tree,
)
from .static import SampledTree, StaticTree, as_policy

__all__ = [
    "Tree", "TreeChoices", "compile_tree", "chain_tree", "depths_from_parents", "ancestor_matrix", "retrieve_paths",
    "validate_parents", "EAGLE_MC_SIM_7B_63", "MEDUSA_MC_SIM_7B_63", "MEDUSA_VICUNA_7B_STAGE2",
    "MEDUSA_VICUNA_7B_STAGE1", "MEDUSA_VICUNA_7B_STAGE1_ABLATION", "MEDUSA_VICUNA_13B_STAGE2",
    "MEDUSA_VICUNA_13B_STAGE1", "MEDUSA_VICUNA_33B_STAGE2", "MEDUSA_VICUNA_33B_STAGE1", "MEDUSA_ZEPHYR_STAGE2",
    "TREE_PRESETS", "StaticTree", "SampledTree", "DynamicTree", "ExpandFn", "TreePolicy", "VocabMap", "as_policy",
    "grow_dynamic_tree", "grow_dynamic_tree_ref",
]
__all__ += [
    "LevelTree", "as_level_policy", "level_tree_draft", "level_tree_draft_ref", "RankAcceptance", "comb_tree",
    "count_rank_hits", "measure_rank_acceptance", "expected_accept_length", "optimal_tree", "sequoia_tree"
]
__all__ += ["rank_candidates"]
from .level import Transition  # noqa: E402

__all__ += ["Transition"]
