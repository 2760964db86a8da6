"""Methods as recipes: each is a composition of blocks (a drafter, a head, a tree policy) and nothing else.

A recipe returns a :class:`~specdec.drafters.Drafter`; ``generate()`` picks the verifier that is exact for
the drafter's scheme. Adding a method means adding its head, format and training loss, and one function here.
Recipes of drafters with capturable steps apply :func:`specdec.graphs.cuda_graphed` on request (``cuda_graphs``,
default on: graphs on CUDA, eager elsewhere).

=================  ==========================================================  =======================
recipe             composition                                                 paper
=================  ==========================================================  =======================
``sps``            an independent draft model, chain (or static tree)          arXiv 2211.17192
``prompt_lookup``  n-gram lookup in the context, chain                         (Saxena 2023)
``eagle1``         EAGLE-1 head + static top-k tree (``mc_sim_7b_63``)         arXiv 2401.15077
``eagle2``         EAGLE head + dynamic tree (expand top-k, rerank)            arXiv 2406.16858
``eagle3``         EAGLE-3 head (fused target layers, draft vocab) + dynamic   arXiv 2503.01840
``medusa1/2``      Medusa heads (one forward) + level-wise static tree         arXiv 2401.10774
``medusa_typical`` the same drafter + typical acceptance (**lossy**)           arXiv 2401.10774
=================  ==========================================================  =======================

Example:
    >>> import specdec as sd                                                    # doctest: +SKIP
    >>> drafter = sd.recipes.eagle2(sd.formats.load_eagle_head("path", target)) # doctest: +SKIP
    >>> out = sd.generate(target, ids, drafter=drafter)                         # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .drafters.draft_model import DraftModelDrafter
from .drafters.eagle import EagleDrafter
from .drafters.parallel import ParallelDrafter
from .drafters.prompt_lookup import PromptLookupDrafter
from .graphs import GraphedDrafter, cuda_graphed
from .heads.eagle import Eagle1Head, Eagle3Head
from .trees.core import EAGLE_MC_SIM_7B_63, MEDUSA_MC_SIM_7B_63, TREE_PRESETS
from .trees.dynamic import DynamicTree
from .trees.level import LevelTree
from .trees.static import StaticTree
from .verify import verify_greedy, verify_typical

__all__ = ["sps", "prompt_lookup", "eagle1", "eagle2", "eagle3", "medusa", "medusa1", "medusa2", "medusa_tree",
           "typical_acceptance", "medusa_typical", "LossyRecipe"]


def sps(draft_model, num_drafts: int | None = None, *, tree=None, mode: str = "auto") -> DraftModelDrafter:
    """SpS: an independent draft model (any HF causal LM sharing the target's tokenizer) drafting a chain.

    Args:
        draft_model: the draft HF causal LM.
        num_drafts: ``K``, the chain length (default 4; with ``tree``, the tree's depth).
        tree: optional static tree choices (SpecInfer-style token trees).
        mode: how drafts are chosen (see :class:`~specdec.drafters.DraftModelDrafter`).

    Returns:
        A :class:`~specdec.drafters.DraftModelDrafter`.

    References:
        Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318.
    """
    return DraftModelDrafter(draft_model, num_drafts, tree=tree, mode=mode)


def prompt_lookup(num_drafts: int = 10, **kwargs) -> PromptLookupDrafter:
    """Prompt lookup decoding: model-free n-gram drafts copied from the context.

    Args:
        num_drafts: ``K``, the longest continuation copied.
        **kwargs: passed to :class:`~specdec.drafters.PromptLookupDrafter` (n-gram sizes).

    Returns:
        A :class:`~specdec.drafters.PromptLookupDrafter` (eager; ``generate(fast=True)`` graphs its fixed-width copy
        on CUDA: a static history, the lookup one kernel launch, folded into the verify step).

    References:
        Saxena, "Prompt Lookup Decoding" (2023), github.com/apoorvumang/prompt-lookup-decoding.
    """
    return PromptLookupDrafter(num_drafts=num_drafts, **kwargs)


def _graphed(drafter, cuda_graphs: bool):
    return cuda_graphed(drafter) if cuda_graphs else drafter


def eagle1(head: Eagle1Head, tree=None, *, cuda_graphs: bool = True) -> EagleDrafter | GraphedDrafter:
    """EAGLE-1: an EAGLE-1 head with a static top-k tree (default ``EAGLE_MC_SIM_7B_63``).

    Args:
        head: an :class:`~specdec.heads.Eagle1Head`.
        tree: tree choices or a compiled tree (default: the authors' 26-node ``mc_sim_7b_63``).
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        An :class:`EagleDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        EAGLE arXiv 2401.15077.
    """
    return _graphed(EagleDrafter(head, StaticTree(EAGLE_MC_SIM_7B_63 if tree is None else tree)), cuda_graphs)


def eagle2(head, *, total_tokens: int = 60, depth: int = 6, top_k: int = 10,
           cuda_graphs: bool = True) -> EagleDrafter | GraphedDrafter:
    """EAGLE-2: an EAGLE head with the dynamic tree (expand top-k by cumulative log-prob, rerank).

    Args:
        head: an :class:`~specdec.heads.Eagle1Head` (or an EAGLE-3 head).
        total_tokens, depth, top_k: see :class:`~specdec.trees.DynamicTree`.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        An :class:`EagleDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        EAGLE-2 arXiv 2406.16858.
    """
    return _graphed(EagleDrafter(head, DynamicTree(total_tokens, depth, top_k)), cuda_graphs)


def eagle3(head: Eagle3Head, *, total_tokens: int = 60, depth: int = 8, top_k: int = 10,
           cuda_graphs: bool = True) -> EagleDrafter | GraphedDrafter:
    """EAGLE-3: an EAGLE-3 head with the dynamic tree (deeper by default: the authors advise depth 7-8 in
    their convention, i.e. 8-9 levels here).

    Args:
        head: an :class:`~specdec.heads.Eagle3Head`.
        total_tokens, depth, top_k: see :class:`~specdec.trees.DynamicTree`.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        An :class:`EagleDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        EAGLE-3 arXiv 2503.01840; SafeAILab/EAGLE issue #209 (depth advice).
    """
    if not isinstance(head, Eagle3Head):
        raise TypeError(f"eagle3() needs an Eagle3Head, got {type(head).__name__}; use eagle2() for an EAGLE-1 head")
    return _graphed(EagleDrafter(head, DynamicTree(total_tokens, depth, top_k)), cuda_graphs)


# --------------------------------------------------------------------------------------------------------
# Medusa (parallel heads + level-wise trees)
# --------------------------------------------------------------------------------------------------------



def medusa_tree(tree, num_levels: int) -> LevelTree:
    """Resolve a Medusa tree argument into a :class:`~specdec.trees.LevelTree`.

    Args:
        tree: ``"chain"`` (every level's top-1, ``num_levels`` deep: Medusa without tree attention),
            ``"mc_sim_7b_63"`` or any name of ``specdec.trees.TREE_PRESETS`` (with or without its ``medusa_``
            prefix), tree choices (e.g. from :func:`specdec.trees.optimal_tree`), a compiled tree or a
            :class:`~specdec.trees.LevelTree`.
        num_levels: the head's levels (the chain's length).

    Returns:
        A :class:`~specdec.trees.LevelTree`.
    """
    if isinstance(tree, str) and not tree.lstrip().startswith("["):
        name = tree.strip()
        if name == "chain":
            return LevelTree.chain(num_levels)
        for key in (name, f"medusa_{name}"):
            if key in TREE_PRESETS:
                return LevelTree(TREE_PRESETS[key])
        raise ValueError(f"unknown Medusa tree {tree!r}: use 'chain', 'mc_sim_7b_63', a name of "
                         f"specdec.trees.TREE_PRESETS ({', '.join(TREE_PRESETS)}), or tree choices")
    if tree is None:
        return LevelTree(MEDUSA_MC_SIM_7B_63)
    return tree if isinstance(tree, LevelTree) else LevelTree(tree)


def medusa(head, tree="mc_sim_7b_63", *, cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """Medusa: Medusa heads (one forward of all heads per step) drafting a level-wise tree.

    Lossless: the drafts are deterministic given the target's features, so ``generate()`` verifies them with the
    target-only tree verifier (exact at any temperature; greedy output equals plain greedy decoding).

    Args:
        head: a :class:`~specdec.heads.MedusaHead` (Medusa-1 heads, or Medusa-2 heads with their fine-tuned target).
        tree: ``"mc_sim_7b_63"`` (the authors' default 63-node tree), ``"chain"`` (top-1 of each head), a preset
            name, tree choices (e.g. from :func:`specdec.trees.optimal_tree`) or a compiled tree.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    Example:
        >>> drafter = medusa(load_medusa_head("FasterDecoding/medusa-vicuna-7b-v1.3", target))  # doctest: +SKIP

    References:
        Cai et al., "Medusa", arXiv 2401.10774.
    """
    return _graphed(ParallelDrafter(head, medusa_tree(tree, head.num_levels)), cuda_graphs)


def medusa1(head, tree="mc_sim_7b_63", *, cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """Medusa-1: heads trained on a frozen target (:func:`specdec.training.train_medusa1`). Same as :func:`medusa`.

    Args:
        head: a :class:`~specdec.heads.MedusaHead`.
        tree: see :func:`medusa`.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.1).
    """
    return medusa(head, tree, cuda_graphs=cuda_graphs)


def medusa2(head, tree="mc_sim_7b_63", *, cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """Medusa-2: heads trained jointly with the target (:func:`specdec.training.train_medusa2`).

    The fine-tuned target is a *new* target: run this drafter with it, and judge losslessness against that
    model's own plain decoding (not the original target's).

    Args:
        head: the Medusa-2 :class:`~specdec.heads.MedusaHead`.
        tree: see :func:`medusa`.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.2).
    """
    return medusa(head, tree, cuda_graphs=cuda_graphs)


def typical_acceptance(posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> Callable:
    """Medusa's typical acceptance as a ``generate(verifier=...)`` override. **NOT lossless.**

    Accepts a draft ``x`` under the target's processed distribution ``p`` iff
    ``p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p)))``, along the path (see
    :func:`specdec.verify.verify_typical`). The output no longer follows the target's law: use it only when
    trading fidelity for acceptance is acceptable. At temperature 0 (``generate`` passes no randomness) it is plain
    greedy verification; as the temperature goes to 0 it converges to greedy decoding.

    Args:
        posterior_threshold: ``epsilon`` (Medusa default 0.09).
        posterior_alpha: ``alpha`` (Medusa default 0.3, about ``sqrt(epsilon)``).

    Returns:
        A verifier ``(target_probs, draft, source=None) -> VerifyResult`` with ``lossless = False``.

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.1, typical acceptance).
    """
    if not (posterior_threshold >= 0 and posterior_alpha > 0):
        raise ValueError(f"typical acceptance needs posterior_threshold >= 0 and posterior_alpha > 0, got "
                         f"{posterior_threshold} and {posterior_alpha}")

    def verify_typical_lossy(target_probs, draft, source=None, *, max_depth=None):
        if source is None:  # generate() at temperature 0: raw logits, no randomness -> greedy
            return verify_greedy(target_probs, draft, max_depth=max_depth)
        return verify_typical(target_probs, draft, source, posterior_threshold=posterior_threshold,
                              posterior_alpha=posterior_alpha, max_depth=max_depth)

    verify_typical_lossy.lossless = False
    verify_typical_lossy.exact_for = frozenset()
    verify_typical_lossy.posterior_threshold = posterior_threshold
    verify_typical_lossy.posterior_alpha = posterior_alpha
    return verify_typical_lossy


class LossyRecipe(NamedTuple):
    """A drafter with a verifier that is **not lossless**: pass both to ``generate`` (``**recipe._asdict()``).

    Attributes:
        drafter: the drafter.
        verifier: the lossy verifier (``verifier.lossless`` is False).
    """

    drafter: object
    verifier: Callable


def medusa_typical(head, tree="mc_sim_7b_63", *, posterior_threshold: float = 0.09,
                   posterior_alpha: float = 0.3, cuda_graphs: bool = True) -> LossyRecipe:
    """Medusa with typical acceptance, as the authors run it at T > 0. **NOT lossless.**

    Typical acceptance accepts longer drafts than rejection sampling but its output does not follow the target's
    distribution (``specdec.verify.verify_typical``; tests show the law test fails). For lossless Medusa use
    :func:`medusa`, whose drafts the exact target-only tree verifier checks at any temperature.

    Args:
        head: a :class:`~specdec.heads.MedusaHead`.
        tree: see :func:`medusa`.
        posterior_threshold, posterior_alpha: see :func:`typical_acceptance`.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`LossyRecipe` ``(drafter, verifier)``.

    Example:
        >>> recipe = medusa_typical(head)                                                     # doctest: +SKIP
        >>> out = sd.generate(target, ids, **recipe._asdict(), temperature=0.7, generator=g)  # doctest: +SKIP

    References:
        Medusa arXiv 2401.10774 (Sec. 2.3.1).
    """
    return LossyRecipe(medusa(head, tree, cuda_graphs=cuda_graphs),
                       typical_acceptance(posterior_threshold, posterior_alpha))


def peagle(head, tree=None, *, num_drafts: int | None = None,
           cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """P-EAGLE: a :class:`~specdec.heads.PEagleHead` drafting all levels in one forward (chain or level-wise tree).

    Lossless: the drafts are a deterministic function of the committed tokens and the target's features, so
    ``generate()`` verifies them with the target-only tree verifier (exact at any temperature; greedy output equals
    plain greedy decoding).

    Args:
        head: a :class:`~specdec.heads.PEagleHead` (e.g. from :func:`specdec.formats.load_peagle_head`).
        tree: ``None`` / ``"chain"`` (every level's top-1), or a level-wise tree as :func:`medusa_tree` takes
            (preset name, tree choices, a compiled tree, a :class:`~specdec.trees.LevelTree`): node
            ``(r_1, ..., r_d)`` holds rank ``r_d`` of level ``d``'s logits.
        num_drafts: chain length ``K`` (default: the head's ``max_drafts``); ignored with a tree.
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    Example:
        >>> drafter = peagle(load_peagle_head("out/peagle/final", target), num_drafts=6)  # doctest: +SKIP

    References:
        P-EAGLE arXiv 2602.01469; Medusa arXiv 2401.10774 (level-wise trees from per-level top-k).
    """
    if tree is None or tree == "chain":
        depth = head.num_levels if num_drafts is None else int(num_drafts)
        if not 1 <= depth <= head.num_levels:
            raise ValueError(f"num_drafts must lie in [1, {head.num_levels}] (the head's max_drafts), got {depth}: "
                             f"train or load a head with more levels")
        return _graphed(ParallelDrafter(head, LevelTree.chain(depth)), cuda_graphs)
    return _graphed(ParallelDrafter(head, medusa_tree(tree, head.num_levels)), cuda_graphs)


# --------------------------------------------------------------------------------------------------------
# DFlash / DSpark (block drafters: one forward drafts a whole block; level-wise trees as Medusa)
# --------------------------------------------------------------------------------------------------------

__all__ += ["dflash", "dspark"]


def _block_tree(head, tree) -> LevelTree:
    return LevelTree.chain(head.num_levels) if tree is None else medusa_tree(tree, head.num_levels)


def dflash(head, tree=None, *, cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """DFlash: a block drafter (mask slots after the anchor, target features as context) drafting every level in
    one forward; a chain of the levels' top-1s by default, or a level-wise tree from per-level top-k (as Medusa).

    Lossless: the drafts are a deterministic function of the head's outputs, so ``generate()`` verifies them with
    the target-only tree verifier (exact at any temperature; greedy output equals plain greedy decoding).

    Args:
        head: a :class:`~specdec.heads.DFlashHead` (``specdec.formats.load_dflash_head`` or
            ``specdec.training.train_dflash``).
        tree: ``None`` (the chain of ``head.num_levels`` top-1s, as z-lab and vLLM draft), ``"chain"``, a preset
            name, tree choices or a :class:`~specdec.trees.LevelTree` (node ``(r_1..r_d)`` = rank ``r_d`` of level
            ``d``).
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    Example:
        >>> drafter = dflash(load_dflash_head("z-lab/Qwen3-8B-DFlash-b16", target))   # doctest: +SKIP

    References:
        DFlash arXiv 2602.06036.
    """
    return _graphed(ParallelDrafter(head, _block_tree(head, tree)), cuda_graphs)


def dspark(head, tree=None, *, gate="confidence", cuda_graphs: bool = True) -> ParallelDrafter | GraphedDrafter:
    """DSpark: DFlash plus a Markov head (each node's logits biased by its parent's token) and a confidence head
    that cuts each row's verified depth (confidence-gated verification).

    Lossless: a gate only removes drafts (each row keeps a prefix of its draft), and the drafts stay a
    deterministic function of the head's outputs, so the target-only tree verifier stays exact at any
    temperature; greedy output equals plain greedy decoding.

    Args:
        head: a :class:`~specdec.heads.DSparkHead`.
        tree: as :func:`dflash` (default: the chain, sequential argmax under the Markov bias).
        gate: ``"confidence"`` (default: :class:`specdec.gating.ConfidenceGate` ``(threshold=0.5)`` when the head
            has a confidence head, none otherwise), ``None`` (verify every level), or a callable
            ``confidence [B, D] -> lengths [B]`` (e.g. ``ConfidenceGate(0.3)``).
        cuda_graphs: wrap the drafter with :func:`specdec.graphs.cuda_graphed` (CUDA graphs on CUDA).

    Returns:
        A :class:`~specdec.drafters.parallel.ParallelDrafter`, wrapped with ``cuda_graphed`` when ``cuda_graphs``.

    References:
        DSpark arXiv 2607.05147 (Markov head; confidence head; adaptive verification).
    """
    if isinstance(gate, str):
        if gate != "confidence":
            raise ValueError(f"gate must be 'confidence', None or a callable confidence -> lengths, got {gate!r}")
        gate = None
        if getattr(head, "confidence_head", None) is not None:
            from .gating import ConfidenceGate

            gate = ConfidenceGate(threshold=0.5)
    policy = _block_tree(head, tree)
    drafter = ParallelDrafter(head, policy) if gate is None else ParallelDrafter(head, policy, gate=gate)
    return _graphed(drafter, cuda_graphs)
