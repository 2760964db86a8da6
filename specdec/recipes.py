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
=================  ==========================================================  =======================

Example:
    >>> import specdec as sd                                                    # doctest: +SKIP
    >>> drafter = sd.recipes.eagle2(sd.formats.load_eagle_head("path", target)) # doctest: +SKIP
    >>> out = sd.generate(target, ids, drafter=drafter)                         # doctest: +SKIP
"""
from __future__ import annotations

from .drafters.draft_model import DraftModelDrafter
from .graphs import GraphedDrafter, cuda_graphed
from .drafters.eagle import EagleDrafter
from .drafters.prompt_lookup import PromptLookupDrafter
from .heads.eagle import Eagle1Head, Eagle3Head
from .trees.core import EAGLE_MC_SIM_7B_63
from .trees.dynamic import DynamicTree
from .trees.static import StaticTree

__all__ = ["sps", "prompt_lookup", "eagle1", "eagle2", "eagle3"]


def sps(draft_model, num_drafts: int = 4, *, tree=None, mode: str = "auto") -> DraftModelDrafter:
    """SpS: an independent draft model (any HF causal LM sharing the target's tokenizer) drafting a chain.

    Args:
        draft_model: the draft HF causal LM.
        num_drafts: ``K``, the chain length (or the depth bound of ``tree``).
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
        A :class:`~specdec.drafters.PromptLookupDrafter`.

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
