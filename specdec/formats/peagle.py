"""Load and save P-EAGLE heads in the vLLM ``speculators`` ``peagle`` layout (the layout vLLM serves).

``config.json``::

    speculators_model_type  "peagle"            architectures  ["PEagleSpeculator"]
    transformer_layer_config  a Llama config of the draft layers (vocab_size = the target's V)
    mask_token_id           the mask slots' token id; also written as pard_token and ptd_token_id (vLLM's names)
    eagle_aux_hidden_state_layer_ids  the target layers read (see "Index convention")
    draft_vocab_size, norm_before_residual, target_hidden_size   as EAGLE-3
    speculators_config      {algorithm "peagle", proposal_methods[0].speculative_tokens = K, verifier {...}}

``model.safetensors``: ``mask_hidden`` (``[1, 1, n_aux * H_t]`` as speculators stores it; any shape with that
many elements loads), ``fc.weight``, ``layers.{i}.*`` (layer 0 with ``hidden_norm``), ``norm.weight``,
``lm_head.weight``, optional ``d2t`` / ``t2d``, and ``embed_tokens.weight`` whose row ``mask_token_id`` is the
learned mask embedding (one row longer than the target's vocabulary when ``mask_token_id == V``). ``model.``
prefixes and ``midlayer.*`` are accepted on load.

Index convention: ``eagle_aux_hidden_state_layer_ids`` holds our ``feature_layers`` unchanged: HF
``hidden_states`` index ``i`` = the input of decoder layer ``i``, which is what vLLM's EAGLE-3 collects for aux
layer id ``i`` (the same convention :mod:`specdec.formats.eagle` uses; DFlash's ``target_layer_ids`` differ by one).

References:
    P-EAGLE arXiv 2602.01469; vllm-project/speculators (``peagle`` model type); vLLM ``parallel_drafting``
    (``pard_token`` / ``ptd_token_id``, ``mask_hidden``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..heads.eagle import target_dims
from ..heads.peagle import PEagleConfig, PEagleHead, peagle_feature_layers
from .common import read_weights, resolve_checkpoint, write_checkpoint
from .eagle import _aux_layers_and_vocab, _dtype_name, _llama_config, _normalize_keys, _num_layers, _rope

__all__ = ["PEagleFormatError", "load_peagle_head", "save_peagle_head"]

# vLLM's lookup order for the parallel-drafting token id (research/eagle.md section 9.1)
_MASK_TOKEN_FIELDS = ("mask_token_id", "pard_token", "ptd_token_id")


class PEagleFormatError(ValueError):
    """A P-EAGLE checkpoint lacks a required field or weight (the message names it and the fix)."""


def _mask_token_id(config: dict) -> int:
    for where in (config, config.get("transformer_layer_config") or {}):
        for name in _MASK_TOKEN_FIELDS:
            if where.get(name) is not None:
                return int(where[name])
    raise PEagleFormatError(
        "config.json has no mask token id: set 'mask_token_id' (vLLM also reads 'pard_token' / 'ptd_token_id') to "
        "the token id the head was trained with for its mask slots")


def load_peagle_head(path_or_hub_id, target, *, feature_layers=None, max_drafts: int | None = None,
                     dtype: torch.dtype | None = None, device=None) -> PEagleHead:
    """Load a P-EAGLE head for ``target`` from a speculators ``peagle`` checkpoint.

    Args:
        path_or_hub_id: a local folder or a hub id.
        target: the HF causal LM the head was trained for.
        feature_layers: override the target layers read (default: ``eagle_aux_hidden_state_layer_ids``, else
            :func:`~specdec.heads.peagle_feature_layers`).
        max_drafts: levels one forward drafts (default: ``max_drafts`` of the config, else
            ``speculators_config.proposal_methods[0].speculative_tokens``, else 4).
        dtype: default: the target's.
        device: default: the target's.

    Returns:
        A :class:`~specdec.heads.PEagleHead` in eval mode.

    Raises:
        PEagleFormatError: no mask token id in the config, no ``mask_hidden`` weight, or no embedding row for the
            mask token (each message says how to fix it).
        ValueError: the head was made for another hidden size or vocabulary.

    References:
        vllm-project/speculators ``peagle``; vLLM ``parallel_drafting``.
    """
    folder = resolve_checkpoint(path_or_hub_id)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {folder}: a P-EAGLE checkpoint needs its config")
    config = json.loads(config_path.read_text())
    stype = config.get("speculators_model_type")
    if stype not in (None, "peagle"):
        raise PEagleFormatError(f"speculators_model_type is {stype!r}, not 'peagle': load EAGLE-3 heads with "
                                f"specdec.formats.load_eagle_head")
    mask_id = _mask_token_id(config)
    state = _normalize_keys(read_weights(folder, what="P-EAGLE weights"))
    if "mask_hidden" not in state:
        raise PEagleFormatError(
            f"the checkpoint in {folder} has no 'mask_hidden' weight (the learned hidden state of mask slots), so it "
            f"cannot draft in parallel: it is likely a plain EAGLE-3 head (load it with load_eagle_head) or was saved "
            f"without it (re-export it with save_peagle_head)")
    layer_config = dict(config.get("transformer_layer_config") or config)
    target_hidden, target_layers, target_vocab = target_dims(target)
    dtype = target.get_input_embeddings().weight.dtype if dtype is None else dtype
    device = target.get_input_embeddings().weight.device if device is None else device

    hidden = int(state["layers.0.post_attention_layernorm.weight"].shape[0])
    heads = int(layer_config.get("num_attention_heads") or 0)
    if heads <= 0:
        raise PEagleFormatError("transformer_layer_config has no num_attention_heads: add the draft layers' Llama "
                                "config")
    head_dim = int(layer_config.get("head_dim") or state["layers.0.self_attn.q_proj.weight"].shape[0] // heads)
    vocab = int(layer_config.get("vocab_size") or target_vocab)
    if vocab != target_vocab:
        raise ValueError(f"the head was made for a vocabulary of {vocab} tokens but the target has {target_vocab}")
    made_for = int(config.get("target_hidden_size") or hidden)
    fc_in = int(state["fc.weight"].shape[1])
    if made_for != target_hidden or fc_in % target_hidden:
        raise ValueError(f"this P-EAGLE head was made for a target with hidden size {made_for} but the target has "
                         f"hidden size {target_hidden}")
    layers, draft_vocab, d2t, t2d = _aux_layers_and_vocab(
        state, config, feature_layers, peagle_feature_layers(target_layers), target_hidden=target_hidden,
        target_layers=target_layers, target_vocab=target_vocab)
    embed = state.pop("embed_tokens.weight", None)
    if "mask_embedding" in state:
        mask_embedding = state.pop("mask_embedding")
    elif embed is not None and mask_id < embed.shape[0]:
        mask_embedding = embed[mask_id]
    else:
        raise PEagleFormatError(
            f"no embedding for the mask token {mask_id}: 'embed_tokens.weight' must have a row {mask_id} (the "
            f"learned mask embedding); re-export the head with save_peagle_head")
    if hidden == target_hidden:
        embed_weight = embed[:target_vocab] if embed is not None else target.get_input_embeddings().weight
    elif embed is not None:
        embed_weight = embed[:target_vocab]
    else:
        raise ValueError(f"the head's width ({hidden}) differs from the target's hidden size ({target_hidden}) and "
                         f"the checkpoint has no embed_tokens.weight")
    max_drafts = max_drafts or config.get("max_drafts") or \
        (((config.get("speculators_config") or {}).get("proposal_methods") or [{}])[0].get("speculative_tokens")) or 4
    theta, factor = _rope(layer_config)
    pconfig = PEagleConfig(
        hidden_size=hidden, intermediate_size=int(state["layers.0.mlp.gate_proj.weight"].shape[0]),
        num_attention_heads=heads, num_key_value_heads=int(state["layers.0.self_attn.k_proj.weight"].shape[0]
                                                           // head_dim),
        head_dim=head_dim, vocab_size=target_vocab, feature_layers=layers, num_layers=_num_layers(state),
        rms_norm_eps=float(layer_config.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling_factor=factor,
        qkv_bias="layers.0.self_attn.q_proj.bias" in state,
        draft_vocab_size=None if draft_vocab == target_vocab else draft_vocab,
        target_hidden_size=target_hidden if target_hidden != hidden else None,
        norm_before_residual=bool(config.get("norm_before_residual", False)), max_drafts=int(max_drafts),
        mask_token_id=mask_id)
    head = PEagleHead(pconfig, embed_weight.to(device=device, dtype=dtype), d2t, t2d)
    state["mask_hidden"] = state["mask_hidden"].reshape(-1)
    state["mask_embedding"] = mask_embedding
    if d2t is not None:
        state["d2t"], state["t2d"] = d2t, t2d
    else:
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    if state["mask_hidden"].numel() != fc_in:
        raise PEagleFormatError(f"mask_hidden has {state['mask_hidden'].numel()} elements but fc reads {fc_in}: the "
                                f"checkpoint is inconsistent")
    head.load_state_dict(state, strict=True)
    return head.to(device=device, dtype=dtype).eval()


def save_peagle_head(head: PEagleHead, path, *, verifier_name_or_path: str = "",
                     verifier_architectures=("LlamaForCausalLM",), num_speculative_tokens: int | None = None) -> Path:
    """Save a P-EAGLE head in the speculators ``peagle`` layout (loadable by :func:`load_peagle_head` and vLLM).

    Args:
        head: a :class:`~specdec.heads.PEagleHead`.
        path: output folder (created).
        verifier_name_or_path: the target's hub id or path (``speculators_config.verifier``).
        verifier_architectures: the target's ``architectures``.
        num_speculative_tokens: vLLM's ``K`` (default: the head's ``max_drafts``).

    Returns:
        The folder (``config.json`` + ``model.safetensors``).

    Example:
        >>> save_peagle_head(head, "out/peagle", verifier_name_or_path="meta-llama/Llama-3.1-8B")  # doctest: +SKIP
        >>> # vllm serve ... --speculative-config '{"method": "eagle3", "model": "out/peagle",
        >>> #                 "num_speculative_tokens": 4, "parallel_drafting": true}'

    References:
        vllm-project/speculators ``peagle``; vLLM ``parallel_drafting``.
    """
    if not isinstance(head, PEagleHead):
        raise TypeError(f"expected a PEagleHead, got {type(head).__name__}")
    c = head.config
    layer_config = _llama_config(head)
    layer_config.pop("torch_dtype")
    k = int(num_speculative_tokens or c.max_drafts)
    config = {
        "architectures": ["PEagleSpeculator"],
        "speculators_model_type": "peagle",
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "peagle",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(verifier_name_or_path), "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": layer_config,
        "mask_token_id": c.mask_token_id,
        "pard_token": c.mask_token_id,
        "ptd_token_id": c.mask_token_id,
        "max_drafts": c.max_drafts,
        "draft_vocab_size": c.draft_vocab,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(head.dtype),
    }
    state = {k: v for k, v in head.state_dict().items() if k != "mask_embedding"}
    state["mask_hidden"] = head.mask_hidden.detach().reshape(1, 1, -1)
    embed = head.embed_weight.detach()
    if c.mask_token_id >= embed.shape[0]:
        embed = torch.cat([embed, embed.new_zeros(c.mask_token_id + 1 - embed.shape[0], embed.shape[1])])
    else:
        embed = embed.clone()
    embed[c.mask_token_id] = head.mask_embedding.detach().to(embed.dtype)
    state["embed_tokens.weight"] = embed
    return write_checkpoint(path, config, state)
