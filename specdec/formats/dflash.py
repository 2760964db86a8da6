"""Load and save DFlash / DSpark heads: the vLLM ``speculators`` layout and z-lab's DFlash layout.

==========================  ===============================================================================
speculators ``dflash`` /    ``config.json``: ``speculators_model_type`` (``"dflash"`` / ``"dspark"``),
``dspark``                  ``architectures`` (``DFlashSpeculator`` / ``DSparkSpeculator``),
                            ``transformer_layer_config`` (nested Qwen3 / Llama config), ``block_size``,
                            ``aux_hidden_state_layer_ids``, ``mask_token_id`` (and the aliases vLLM looks up:
                            ``dflash_config.mask_token_id``, ``dspark_noise_token_id``, ``pard_token``,
                            ``ptd_token_id``), ``target_hidden_size``, ``sample_from_anchor``; DSpark:
                            ``markov_rank``, ``markov_head_type``, ``enable_confidence_head``,
                            ``confidence_head_with_markov``, ``confidence_head_alpha``; ``speculators_config``
                            (``proposal_methods[0].speculative_tokens``, ``verifier``). Weights ``layers.*``,
                            ``fc``, ``hidden_norm``, ``norm``; DSpark ``markov_head.markov_w1`` / ``markov_w2``
                            (``gate_proj``), ``confidence_head.proj``; no embeddings / ``lm_head`` (the
                            target's are shared).
z-lab DFlash                ``config.json``: a Qwen3 config with ``architectures ["DFlashDraftModel"]``,
                            ``dflash_config {mask_token_id, target_layer_ids}``, ``block_size`` at the top
                            level (older checkpoints) or in ``dflash_config`` (newer), ``num_target_layers``.
                            Weights ``layers.*`` (``q_norm`` / ``k_norm``), ``fc``, ``hidden_norm``, ``norm``.
==========================  ===============================================================================

Layer indices: ours are HF ``hidden_states`` indices; speculators' ``aux_hidden_state_layer_ids`` are the same
numbers; z-lab's ``target_layer_ids`` are one less (z-lab reads ``hidden_states[id + 1]``). A missing required
field raises :class:`DFlashFormatError` naming the field and the fix.

References:
    DFlash arXiv 2602.06036 (z-lab checkpoints, e.g. ``z-lab/Qwen3-4B-DFlash-b16``); DSpark arXiv 2607.05147;
    vllm-project/speculators ``DFlashSpeculatorConfig`` / ``DSparkSpeculatorConfig``; vLLM's parallel-drafting
    token lookup.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..heads.common import target_dims
from ..heads.dflash import DFlashConfig, DFlashHead, DSparkHead
from .common import read_weights, resolve_checkpoint, write_checkpoint

__all__ = ["DFlashFormatError", "load_dflash_head", "save_dflash_head", "export_dflash_zlab", "mask_token_id_of"]

_MASK_ALIASES = ("dflash_config.mask_token_id", "mask_token_id", "dspark_noise_token_id", "pard_token",
                 "ptd_token_id")
_DSPARK_FIELDS = ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov",
                  "confidence_head_alpha")


class DFlashFormatError(ValueError):
    """A DFlash / DSpark checkpoint lacks a required field or holds an unsupported variant (the message names
    the field and the fix)."""


def _lookup(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def mask_token_id_of(config: dict) -> int:
    """The mask token id of a DFlash / DSpark / P-EAGLE config, under any name vLLM looks up.

    Looks up, in vLLM's order, ``dflash_config.mask_token_id``, ``mask_token_id``, ``dspark_noise_token_id``,
    ``pard_token``, ``ptd_token_id``.

    Args:
        config: the parsed ``config.json``.

    Returns:
        The token id.

    Raises:
        DFlashFormatError: none is set, or two of them disagree.
    """
    found = {name: _lookup(config, name) for name in _MASK_ALIASES}
    found = {k: int(v) for k, v in found.items() if v is not None}
    if not found:
        raise DFlashFormatError(f"the config has no mask token id: set one of {', '.join(_MASK_ALIASES)} to the id "
                                f"that fills the block's slots (the drafter was trained with it)")
    if len(set(found.values())) > 1:
        raise DFlashFormatError(f"the config's mask token ids disagree: {found}; keep one value under every name")
    return next(iter(found.values()))


def _normalize(state: dict, config: dict) -> dict:
    out = {}
    for key, value in state.items():
        key = key[len("model."):] if key.startswith("model.") else key
        if key.startswith("verifier_") or key == "embed_tokens.weight":
            continue  # the target's own (shared at run time, never needed from the checkpoint)
        fused = re.match(r"(layers\.\d+\.self_attn\.)qkv_proj\.(weight|bias)$", key)
        if fused:  # some exports fuse q/k/v: split by the config's head counts
            layer = config
            heads = int(layer["num_attention_heads"])
            kv = int(layer.get("num_key_value_heads") or heads)
            d = value.shape[0] // (heads + 2 * kv)
            q, k, v = value.split([heads * d, kv * d, kv * d])
            for name, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                out[f"{fused.group(1)}{name}.{fused.group(2)}"] = part
            continue
        out[key] = value
    return out


def _num_layers(state: dict) -> int:
    ids = {int(m.group(1)) for k in state for m in [re.match(r"layers\.(\d+)\.", k)] if m}
    if not ids or ids != set(range(len(ids))):
        raise DFlashFormatError(f"the checkpoint's decoder layers {sorted(ids)} are not numbered 0..n-1 (keys "
                                f"'layers.N.*'): not a DFlash checkpoint")
    return len(ids)


def _rope(layer: dict) -> tuple[float, float]:
    params = layer.get("rope_parameters") if isinstance(layer.get("rope_parameters"), dict) else {}
    theta = layer.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = layer.get("rope_scaling") or params or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return float(theta), float(scaling.get("factor", 1.0))
    if kind not in (None, "default"):
        raise DFlashFormatError(f"rope scaling {kind!r} in the head's config is not implemented (only linear): "
                                f"remove rope_scaling or convert the head")
    return float(theta), 1.0


def _required(config: dict, name: str, fix: str):
    value = _lookup(config, name)
    if value is None:
        raise DFlashFormatError(f"the config lacks {name!r}: {fix}")
    return value


def _parse(config: dict) -> tuple[str, dict, dict]:
    """``(kind, layer_config, fields)`` with ``kind`` in ``"dflash"``, ``"dspark"``."""
    stype = config.get("speculators_model_type")
    if stype is not None:
        if stype not in ("dflash", "dspark"):
            raise DFlashFormatError(f"speculators_model_type {stype!r} is not a DFlash / DSpark checkpoint: load "
                                    f"'eagle3' with load_eagle_head and 'peagle' with the P-EAGLE loader")
        layer = _required(config, "transformer_layer_config", "a speculators checkpoint nests its decoder layer's "
                          "HF config there (num_attention_heads, rms_norm_eps, rope_theta, vocab_size, ...)")
        aux = config.get("aux_hidden_state_layer_ids")
        if aux is None and _lookup(config, "dflash_config.target_layer_ids") is not None:
            aux = [int(i) + 1 for i in _lookup(config, "dflash_config.target_layer_ids")]
        if aux is None:
            raise DFlashFormatError("the config lacks 'aux_hidden_state_layer_ids': list the target layers the "
                                    "context fuses (HF hidden_states indices, i.e. z-lab target_layer_ids + 1)")
        block = config.get("block_size", _lookup(config, "dflash_config.block_size"))
        if block is None:
            raise DFlashFormatError("the config lacks 'block_size': set the slots of one block (anchor included)")
        fields = dict(feature_layers=tuple(int(i) for i in aux), block_size=int(block),
                      mask_token_id=mask_token_id_of(config), target_hidden_size=config.get("target_hidden_size"),
                      sample_from_anchor=bool(config.get("sample_from_anchor", stype == "dspark")))
        if stype == "dspark":
            fields.update({k: config[k] for k in _DSPARK_FIELDS if config.get(k) is not None})
        return stype, dict(layer), fields
    if "DFlashDraftModel" in (config.get("architectures") or []) or config.get("dflash_config") is not None:
        ids = _lookup(config, "dflash_config.target_layer_ids")
        if ids is None:
            ids = config.get("target_layer_ids")
        if ids is None:
            raise DFlashFormatError("the z-lab config lacks 'dflash_config.target_layer_ids': list the target "
                                    "decoder layers whose outputs the context fuses (z-lab reads "
                                    "hidden_states[id + 1])")
        block = _lookup(config, "dflash_config.block_size")
        block = config.get("block_size") if block is None else block
        if block is None:
            raise DFlashFormatError("the z-lab config lacks 'block_size' (top level or in dflash_config): set the "
                                    "slots of one block")
        fields = dict(feature_layers=tuple(int(i) + 1 for i in ids), block_size=int(block),
                      mask_token_id=mask_token_id_of(config), sample_from_anchor=False)
        return "dflash", config, fields
    raise DFlashFormatError("config.json is neither a speculators 'dflash' / 'dspark' config "
                            "(speculators_model_type) nor a z-lab DFlash config (architectures "
                            "['DFlashDraftModel'], dflash_config)")


def load_dflash_head(path_or_hub_id, target, *, dtype: torch.dtype | None = None, device=None) -> DFlashHead:
    """Load a DFlash or DSpark head for ``target`` from the speculators or the z-lab layout.

    Args:
        path_or_hub_id: a local folder, or a Hugging Face hub id (``huggingface_hub.snapshot_download``).
        target: the HF causal LM the head was trained for (its embeddings and ``lm_head`` are shared).
        dtype: default: the target's.
        device: default: the target's.

    Returns:
        A :class:`~specdec.heads.DFlashHead` (or :class:`~specdec.heads.DSparkHead`) in eval mode.

    Raises:
        DFlashFormatError: a required field is missing (named) or the variant is unsupported (sliding-window
            layers, a reduced draft vocabulary, non-linear RoPE scaling).
        ValueError: the head was made for another hidden size, vocabulary or depth (both sizes named), or keys
            are missing / unexpected.

    Example:
        >>> head = load_dflash_head("z-lab/Qwen3-4B-DFlash-b16", target)     # doctest: +SKIP

    References:
        DFlash arXiv 2602.06036; DSpark arXiv 2607.05147; vllm-project/speculators.
    """
    folder = resolve_checkpoint(path_or_hub_id)
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"no config.json in {folder}: a DFlash checkpoint needs its config")
    config = json.loads((folder / "config.json").read_text())
    kind, layer, fields = _parse(config)
    if any(t == "sliding_attention" for t in (layer.get("layer_types") or [])):
        raise DFlashFormatError("the head has sliding-window layers (layer_types 'sliding_attention'), which specdec "
                                "does not implement: use a head with full-attention layers only")
    state = _normalize(read_weights(folder, what="DFlash weights"), layer)
    t_hidden, t_layers, t_vocab = target_dims(target)
    vocab = int(layer.get("vocab_size") or t_vocab)
    if vocab != t_vocab:
        raise ValueError(f"the head was made for a vocabulary of {vocab} tokens but the target has {t_vocab}")
    for key in ("d2t", "t2d"):
        if key in state:
            raise DFlashFormatError(f"the checkpoint has {key!r}: a reduced draft vocabulary, which specdec's DFlash "
                                    f"heads do not implement (they use the target's lm_head)")
    lm_head = state.pop("lm_head.weight", None)
    if lm_head is not None and lm_head.shape[0] != t_vocab:
        raise DFlashFormatError(f"the checkpoint's lm_head has {lm_head.shape[0]} rows (a reduced draft vocabulary) "
                                f"but the target has {t_vocab}: not supported")
    needed = ("fc.weight", "norm.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
              "layers.0.mlp.gate_proj.weight")
    missing = [k for k in needed if k not in state]
    if missing:
        raise DFlashFormatError(f"the checkpoint lacks the weights {missing}: not a DFlash / DSpark head (expected "
                                f"'fc', 'hidden_norm', 'norm' and 'layers.N.*', optionally 'model.'-prefixed)")
    heads = int(_required(layer, "num_attention_heads", "set the decoder layer's attention heads"))
    hidden = int(state["norm.weight"].shape[0])
    if hidden != t_hidden:
        raise ValueError(f"this DFlash head has width {hidden} but the target's hidden size is {t_hidden}: it was "
                         f"made for another target (its lm_head is the target's)")
    q = state["layers.0.self_attn.q_proj.weight"]
    head_dim = int(layer.get("head_dim") or q.shape[0] // heads)
    feature_size = int(fields.pop("target_hidden_size", None) or t_hidden)
    fc_in = int(state["fc.weight"].shape[1])
    if feature_size != t_hidden or fc_in != len(fields["feature_layers"]) * t_hidden:
        raise ValueError(f"fc reads {fc_in} features = {len(fields['feature_layers'])} layers x "
                         f"{fc_in // max(len(fields['feature_layers']), 1)} but the target's hidden size is "
                         f"{t_hidden}: the head was made for another target")
    for i in fields["feature_layers"]:
        if not 0 <= i <= t_layers:
            raise ValueError(f"feature layer {i} is out of range for a target with {t_layers} layers: the head was "
                             f"made for a deeper target")
    theta, factor = _rope(layer)
    cls = DSparkHead if kind == "dspark" else DFlashHead
    dconfig = DFlashConfig(
        hidden_size=hidden, intermediate_size=int(state["layers.0.mlp.gate_proj.weight"].shape[0]),
        num_attention_heads=heads, num_key_value_heads=int(state["layers.0.self_attn.k_proj.weight"].shape[0])
        // head_dim, head_dim=head_dim, vocab_size=t_vocab, num_layers=_num_layers(state),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling_factor=factor,
        qk_norm="layers.0.self_attn.q_norm.weight" in state, qkv_bias="layers.0.self_attn.q_proj.bias" in state,
        **fields)
    out = target.get_output_embeddings()
    head = cls(dconfig, target.get_input_embeddings().weight, out.weight, getattr(out, "bias", None))
    result = head.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"the checkpoint does not match a {head.kind} head: missing keys {result.missing_keys}, "
                         f"unexpected keys {result.unexpected_keys}")
    emb = target.get_input_embeddings().weight
    return head.to(device=emb.device if device is None else device,
                   dtype=emb.dtype if dtype is None else dtype).eval()


# --------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _layer_config(head: DFlashHead) -> dict:
    c = head.config
    out = {
        "architectures": ["Qwen3ForCausalLM" if c.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if c.qk_norm else "llama",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim, "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "hidden_act": "silu", "vocab_size": c.vocab_size,
        "max_position_embeddings": 40960, "attention_bias": c.qkv_bias, "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * c.num_layers, "use_sliding_window": False,
    }
    if c.rope_scaling_factor != 1.0:
        out["rope_scaling"] = {"type": "linear", "rope_type": "linear", "factor": c.rope_scaling_factor}
    return out


def save_dflash_head(head: DFlashHead, path, *, verifier_name_or_path: str | None = None,
                     verifier_architectures=("LlamaForCausalLM",)) -> Path:
    """Save a DFlash / DSpark head in the vLLM ``speculators`` layout (``dflash`` or ``dspark``).

    Writes every mask-token alias vLLM looks up, z-lab's ``dflash_config`` (``target_layer_ids`` =
    ``feature_layers - 1``), and ``speculative_tokens`` = the head's levels (``bs - 1``, or ``bs`` with
    ``sample_from_anchor``). Frozen target embeddings / ``lm_head`` are not saved.

    Args:
        head: a :class:`~specdec.heads.DFlashHead` or :class:`~specdec.heads.DSparkHead`.
        path: output folder (created).
        verifier_name_or_path: the target's hub id or path (``speculators_config.verifier.name_or_path``).
        verifier_architectures: the target's ``architectures``.

    Returns:
        The folder, loadable with :func:`load_dflash_head`.

    Example:
        >>> save_dflash_head(head, "out/dflash", verifier_name_or_path="Qwen/Qwen3-8B")   # doctest: +SKIP
        >>> # vllm serve Qwen/Qwen3-8B --speculative-config '{"method": "dflash", "model": "out/dflash",
        >>> #   "num_speculative_tokens": 7}'

    References:
        vllm-project/speculators ``DFlashSpeculatorConfig``, ``DSparkSpeculatorConfig``.
    """
    if not isinstance(head, DFlashHead):
        raise TypeError(f"expected a DFlashHead or DSparkHead, got {type(head).__name__}")
    c = head.config
    kind = "dspark" if isinstance(head, DSparkHead) else "dflash"
    config = {
        "architectures": ["DSparkSpeculator" if kind == "dspark" else "DFlashSpeculator"],
        "speculators_model_type": kind,
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.num_levels,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures)},
        },
        "transformer_layer_config": _layer_config(head),
        "draft_vocab_size": c.vocab_size,
        "block_size": c.block_size,
        "aux_hidden_state_layer_ids": list(c.feature_layers),
        "target_hidden_size": c.feature_size,
        "sample_from_anchor": c.sample_from_anchor,
        "sliding_window_non_causal": False,
        "mask_token_id": c.mask_token_id,
        "dspark_noise_token_id": c.mask_token_id,
        "ptd_token_id": c.mask_token_id,
        "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": [i - 1 for i in c.feature_layers],
                          "block_size": c.block_size},
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(head.dtype),
    }
    if kind == "dspark":
        config.update({k: getattr(c, k) for k in _DSPARK_FIELDS})
    return write_checkpoint(path, config, head.state_dict())


def export_dflash_zlab(head: DFlashHead, path, *, num_target_layers: int | None = None) -> Path:
    """Write a DFlash head in z-lab's layout (``DFlashDraftModel``: Qwen3 config + ``dflash_config``).

    The config carries no ``auto_map`` (specdec ships no remote code): z-lab's loader or
    :func:`load_dflash_head` read it.

    Args:
        head: a plain :class:`~specdec.heads.DFlashHead` with ``sample_from_anchor=False`` and qk-norm layers
            (z-lab's layout has neither Markov / confidence heads nor anchor sampling).
        path: output folder (created).
        num_target_layers: the target's decoder layers (default: the largest feature layer).

    Returns:
        The folder.

    References:
        z-lab DFlash (``z-lab/Qwen3-8B-DFlash-b16``: ``dflash_config {mask_token_id, target_layer_ids}``).
    """
    if isinstance(head, DSparkHead) or not isinstance(head, DFlashHead):
        raise DFlashFormatError(f"z-lab's layout stores plain DFlash heads only (got {type(head).__name__}): save "
                                f"DSpark heads with save_dflash_head (speculators 'dspark')")
    c = head.config
    if c.sample_from_anchor or not c.qk_norm:
        raise DFlashFormatError("z-lab's DFlashDraftModel has Qwen3 layers (qk-norm) and never samples the anchor "
                                "slot: save this head with save_dflash_head (speculators layout) instead")
    config = _layer_config(head)
    config.update({
        "architectures": ["DFlashDraftModel"],
        "block_size": c.block_size,
        "num_target_layers": int(num_target_layers or max(c.feature_layers)),
        "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": [i - 1 for i in c.feature_layers],
                          "block_size": c.block_size},
        "torch_dtype": _dtype_name(head.dtype),
    })
    return write_checkpoint(path, config, head.state_dict())
