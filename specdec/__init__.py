"""specdec: composable, provably lossless speculative-decoding blocks around any HuggingFace causal LM.

A flat public API::

    import specdec as sd
    out = sd.generate(model, ids, drafter=sd.drafters.DraftModelDrafter(small), max_new_tokens=128)
    tree = sd.compile_tree(sd.trees.EAGLE_MC_SIM_7B_63)
    drafter = sd.recipes.eagle2(sd.formats.load_eagle_head("path/or/hub-id", model))

Blocks by kind: ``sd.trees`` (compiler, presets, tree policies), ``sd.masks``, ``sd.sampling``, ``sd.verify``,
``sd.drafters``, ``sd.nn`` (decoder layers shared by the heads), ``sd.heads``, ``sd.formats``, ``sd.training``,
``sd.schedule``, ``sd.adapter``, ``sd.graphs`` (CUDA graphs as a wrapper the caller applies); methods as
compositions in ``sd.recipes``; ``sd.testing`` (sampling-law oracles) and ``sd.bench`` (harness).
"""
from . import (
               adapter,
               bench,
               drafters,
               formats,
               gating,
               graphs,
               heads,
               inputs,
               kernels,
               masks,
               nn,
               recipes,
               rows,
               sampling,
               schedule,
               static,
               stats,
               step,
               testing,
               training,
               trees,
               verify,
)
from .adapter import ConsumedStateError, ModelAdapter, UnsupportedModelError, check_causal_lm
from .drafters import Drafter, DraftModelDrafter, ParallelDrafter, PromptLookupDrafter
from .generate import GenerateOutput, GenerationStats, generate
from .masks import causal_mask_with_padding, prefix_valid_from_lengths, tree_attention_mask, tree_positions
from .sampling import PerRowSource, PredrawnNoise, RandomSource, TorchSource, as_source, next_token, process_logits
from .schedule import Schedule, make_schedule
from .step import DecodeState, StepOutput
from .trees import Tree, chain_tree, compile_tree
from .types import Draft, DraftScheme, SamplingParams, VerifyResult
from .verify import (
               Verifier,
               as_verifier,
               select_verifier,
               verifier_input,
               verify_chain,
               verify_greedy,
               verify_tree_deterministic,
               verify_tree_iid,
               verify_tree_without_replacement,
               verify_typical,
)

__version__ = "0.1.0"

__all__ = [
    # the loop
    "generate", "GenerateOutput", "GenerationStats", "ModelAdapter", "DecodeState", "StepOutput",
    "ConsumedStateError", "UnsupportedModelError", "check_causal_lm",
    # contracts
    "Draft", "DraftScheme", "SamplingParams", "VerifyResult", "Drafter",
    # trees and masks
    "Tree", "compile_tree", "chain_tree", "tree_attention_mask", "tree_positions", "causal_mask_with_padding",
    "prefix_valid_from_lengths",
    # sampling and verification
    "process_logits", "RandomSource", "TorchSource", "PredrawnNoise", "PerRowSource", "as_source", "next_token",
    "Verifier", "as_verifier", "verifier_input", "select_verifier", "verify_greedy",
    "verify_chain",
    "verify_tree_deterministic", "verify_tree_iid", "verify_tree_without_replacement", "verify_typical",
    # drafters and schedules
    "DraftModelDrafter", "PromptLookupDrafter", "ParallelDrafter", "Schedule", "make_schedule",
    # submodules
    "adapter", "bench", "drafters", "formats", "gating", "graphs", "heads", "inputs", "kernels", "masks", "nn",
    "recipes", "rows",
    "sampling", "schedule", "static", "stats", "step", "testing", "training", "trees", "verify",
]
