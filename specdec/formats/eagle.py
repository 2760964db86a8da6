"""Load EAGLE heads from the checkpoint formats users have; save and export ours.

Formats read by :func:`load_eagle_head` (detected from ``config.json`` and the key names):

==========================  =========================================================================
EAGLE authors, EAGLE-1      ``fc.weight`` (+ ``fc.bias`` unless config ``"bias": false``),
                            ``layers.0.self_attn.{q,k,v,o}_proj.weight``, ``layers.0.mlp.*``,
                            ``layers.0.post_attention_layernorm.weight``, optional ``embed_tokens.weight``;
                            Llama-style config. ``pytorch_model.bin`` or ``model.safetensors``.
EAGLE authors, EAGLE-3      ``midlayer.*`` (incl. ``hidden_norm``), ``fc.weight``, ``norm.weight``,
                            ``lm_head.weight``, ``d2t``, ``t2d``; config ``draft_vocab_size``,
                            optional ``target_hidden_size``.
vLLM ``speculators``        config ``speculators_model_type: "eagle3"``, ``transformer_layer_config``,
                            ``draft_vocab_size``, ``eagle_aux_hidden_state_layer_ids``,
                            ``norm_before_residual``; keys ``layers.0.*`` (optionally ``model.``-prefixed).
SpecForge / SGLang          ``model.``-prefixed keys (``model.layers.0.*``, ``model.fc.weight``, ...),
                            unprefixed ``lm_head.weight``, ``d2t``, ``t2d``.
==========================  =========================================================================

Sharded checkpoints (``*.index.json``) are read too. ``embed_tokens.weight`` is optional everywhere: the head
uses the target's embeddings when its width matches the target's (as the authors' main branch does), and the
checkpoint's otherwise. Checkpoints never trust ``num_hidden_layers`` (official EAGLE-3 configs misstate it):
the layers present in the weights count.

References:
    EAGLE arXiv 2401.15077, EAGLE-3 arXiv 2503.01840; vllm-project/speculators (format, ``convert``);
    vLLM ``Eagle3LlamaForCausalLM.load_weights``; SpecForge / SGLang ``LlamaForCausalLMEagle3``.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch

from ..heads.eagle import Eagle1Head, Eagle3Head, EagleConfig, check_draft_vocab, default_feature_layers, target_dims
from .common import read_weights, resolve_checkpoint, write_checkpoint

__all__ = ["load_eagle_head", "save_eagle_head", "export_speculators", "read_state_dict"]

_UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


# --------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------


def read_state_dict(folder) -> dict[str, torch.Tensor]:
    """Read the raw weights of a checkpoint folder (single or sharded, safetensors or PyTorch bin).

    Args:
        folder: a local folder.

    Returns:
        ``{key: tensor}`` with the file's own key names, on CPU.

    Raises:
        FileNotFoundError: no ``model.safetensors``, ``pytorch_model.bin`` or index in the folder.

    References:
        HF ``model.safetensors.index.json`` sharding convention.
    """
    return read_weights(folder)


def _normalize_keys(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        if key.startswith("verifier_"):
            continue  # speculators never needs the verifier's own head / norm
        if key.startswith("model."):
            key = key[len("model."):]
        if key.startswith("midlayer."):
            key = "layers.0." + key[len("midlayer."):]
        if key == "draft_id_to_target_id":
            key = "d2t"
        out[key] = value
    return out


def _rope(config: dict) -> tuple[float, float]:
    theta = config.get("rope_theta")
    params = config.get("rope_parameters")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    scaling = config.get("rope_scaling") or (params if isinstance(params, dict) else None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = 1.0
    if kind == "linear":
        factor = float(scaling.get("factor", 1.0))
    elif kind not in (None, "default"):
        warnings.warn(f"rope scaling {kind!r} of the head's config is not implemented; the head uses plain RoPE "
                      f"(as the EAGLE authors' drafts do for Llama-3 targets)", stacklevel=3)
    return float(theta if theta is not None else 10000.0), factor


def _num_layers(state: dict) -> int:
    ids = {int(m.group(1)) for k in state for m in [re.match(r"layers\.(\d+)\.", k)] if m}
    if not ids:
        raise ValueError("the checkpoint has no decoder layer (no 'layers.N.*' / 'midlayer.*' keys): not an EAGLE "
                         "head")
    if ids != set(range(len(ids))):
        raise ValueError(f"the checkpoint's decoder layers {sorted(ids)} are not numbered 0..n-1")
    return len(ids)


def _draft_vocab(state: dict, vocab: int, draft_vocab: int):
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    if d2t is None and t2d is None:
        if draft_vocab != vocab:
            raise ValueError(f"the head's lm_head has {draft_vocab} rows but the checkpoint has no d2t/t2d to map "
                             f"them to the target's {vocab} tokens")
        return None, None
    if d2t is None:
        used = t2d.bool().nonzero()[:, 0]
        d2t = used - torch.arange(used.shape[0])
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(d2t.shape[0]) + d2t.long()] = True
    return d2t.long(), t2d.bool()


def _aux_layers_and_vocab(state: dict, config: dict, feature_layers, default: tuple[int, ...], *, target_hidden: int,
                          target_layers: int, target_vocab: int):
    """The fused target layers an EAGLE-3-style head reads (checked against ``fc``), and its draft vocabulary.

    Returns:
        ``(layers, draft_vocab, d2t, t2d)``.
    """
    fc_in = int(state["fc.weight"].shape[1])
    layers = feature_layers or config.get("eagle_aux_hidden_state_layer_ids")
    layers = tuple(layers) if layers else tuple(default)
    if len(layers) * target_hidden != fc_in:
        raise ValueError(f"fc reads {fc_in} = {fc_in // target_hidden} x {target_hidden} features but "
                         f"{len(layers)} feature layers {layers} are configured")
    for i in layers:
        if not 0 <= i <= target_layers:
            raise ValueError(f"feature layer {i} is out of range for a target with {target_layers} layers")
    draft_vocab = int(state["lm_head.weight"].shape[0])
    d2t, t2d = _draft_vocab(state, target_vocab, draft_vocab)
    if t2d is not None:
        check_draft_vocab(d2t, t2d, target_vocab)
    return layers, draft_vocab, d2t, t2d


def load_eagle_head(path_or_hub_id, target, *, feature_layers=None, dtype: torch.dtype | None = None,
                    device=None):
    """Load an EAGLE-1 or EAGLE-3 head for ``target`` from any of the public formats.

    Args:
        path_or_hub_id: a local folder, or a Hugging Face hub id (downloaded with
            ``huggingface_hub.snapshot_download``).
        target: the HF causal LM the head was trained for (its embeddings / ``lm_head`` are shared).
        feature_layers: override the target layers an EAGLE-3 head reads (HF ``hidden_states`` indices;
            default: the config's ``eagle_aux_hidden_state_layer_ids``, else ``(2, N // 2, N - 3)``).
        dtype: default: the target's.
        device: default: the target's.

    Returns:
        An :class:`~specdec.eagle.Eagle1Head` or :class:`~specdec.eagle.Eagle3Head` in eval mode.

    Raises:
        ValueError: the head was made for another hidden size or vocabulary (both sizes named), an
            unsupported variant (``norm_before_fc``, ``fc_norm``, another speculators type), or keys are
            missing / unexpected.

    Example:
        >>> head = load_eagle_head("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", target)  # doctest: +SKIP

    References:
        EAGLE arXiv 2401.15077; EAGLE-3 arXiv 2503.01840; vllm-project/speculators.
    """
    folder = resolve_checkpoint(path_or_hub_id)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {folder}: an EAGLE checkpoint needs its config")
    config = json.loads(config_path.read_text())
    state = _normalize_keys(read_state_dict(folder))
    stype = config.get("speculators_model_type")
    if stype is not None:
        if stype != "eagle3":
            raise ValueError(f"speculators model type {stype!r} is not supported here: load_eagle_head reads "
                             f"'eagle3' speculators checkpoints (and the EAGLE authors' EAGLE-1 / EAGLE-3 formats)")
        layer_config = dict(config.get("transformer_layer_config") or {})
        kind = "eagle3"
    else:
        layer_config = config
        kind = "eagle3" if ("layers.0.hidden_norm.weight" in state or "d2t" in state or "t2d" in state) else "eagle1"
    for flag in _UNSUPPORTED_FLAGS:
        if config.get(flag):
            raise ValueError(f"this checkpoint sets {flag}=true (an EAGLE-3 variant with extra norms) which specdec "
                             f"does not implement")
    if any(k.startswith(("input_norm.", "fc_norm.", "aux_norm")) for k in state):
        raise ValueError("this checkpoint has input_norm / fc_norm weights (norm_before_fc / fc_norm variants), "
                         "which specdec does not implement")
    target_hidden, target_layers, target_vocab = target_dims(target)
    if dtype is None:
        dtype = target.get_input_embeddings().weight.dtype
    if device is None:
        device = target.get_input_embeddings().weight.device

    hidden = int(state["layers.0.post_attention_layernorm.weight"].shape[0])
    heads = int(layer_config.get("num_attention_heads") or 0)
    if heads <= 0:
        raise ValueError("the head's config has no num_attention_heads")
    head_dim = int(layer_config.get("head_dim") or state["layers.0.self_attn.q_proj.weight"].shape[0] // heads)
    kv_heads = int(state["layers.0.self_attn.k_proj.weight"].shape[0] // head_dim)
    theta, factor = _rope(layer_config)
    vocab = int(layer_config.get("vocab_size") or target_vocab)
    if vocab != target_vocab:
        raise ValueError(f"the head was made for a vocabulary of {vocab} tokens but the target has {target_vocab}")
    embed = state.pop("embed_tokens.weight", None)
    if embed is not None and embed.shape[0] != target_vocab:
        raise ValueError(f"the head's embed_tokens has {embed.shape[0]} rows but the target's vocabulary has "
                         f"{target_vocab} tokens")
    sizes = dict(
        hidden_size=hidden,
        intermediate_size=int(state["layers.0.mlp.gate_proj.weight"].shape[0]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=target_vocab,
        num_layers=_num_layers(state),
        rms_norm_eps=float(layer_config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling_factor=factor,
        qkv_bias="layers.0.self_attn.q_proj.bias" in state,
    )
    fc_in = int(state["fc.weight"].shape[1])
    if kind == "eagle1":
        if hidden != target_hidden or fc_in != 2 * target_hidden:
            raise ValueError(f"this EAGLE-1 head was made for a target with hidden size {fc_in // 2} but the target "
                             f"has hidden size {target_hidden}")
        econfig = EagleConfig(**sizes, feature_layers=default_feature_layers(target_layers, "eagle1"),
                              fc_bias="fc.bias" in state)
        head = Eagle1Head(econfig, target.get_input_embeddings().weight, target.get_output_embeddings().weight,
                          getattr(target.get_output_embeddings(), "bias", None))
    else:
        made_for = int(config.get("target_hidden_size") or hidden)
        if made_for != target_hidden or fc_in % target_hidden:
            raise ValueError(f"this EAGLE-3 head was made for a target with hidden size {made_for} but the target "
                             f"has hidden size {target_hidden}")
        layers, draft_vocab, d2t, t2d = _aux_layers_and_vocab(
            state, config, feature_layers, default_feature_layers(target_layers, "eagle3"),
            target_hidden=target_hidden, target_layers=target_layers, target_vocab=target_vocab)
        econfig = EagleConfig(**sizes, feature_layers=layers, draft_vocab_size=draft_vocab,
                              target_hidden_size=target_hidden if target_hidden != hidden else None,
                              norm_before_residual=bool(config.get("norm_before_residual", False)))
        if hidden == target_hidden:
            embed_weight = target.get_input_embeddings().weight
        elif embed is not None:
            embed_weight = embed
        else:
            raise ValueError(f"the head's width ({hidden}) differs from the target's hidden size ({target_hidden}) "
                             f"so it needs its own embed_tokens.weight, which the checkpoint lacks")
        head = Eagle3Head(econfig, embed_weight, d2t, t2d)
        state["d2t"], state["t2d"] = head.d2t, head.t2d
    result = head.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"the checkpoint does not match an {head.kind} head: missing keys {result.missing_keys}, "
                         f"unexpected keys {result.unexpected_keys}")
    return head.to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _llama_config(head) -> dict:
    c = head.config
    out = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.num_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": "silu",
        "vocab_size": c.vocab_size,
        "max_position_embeddings": 2048,
        "attention_bias": c.qkv_bias,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(head.dtype),
    }
    if c.rope_scaling_factor != 1.0:
        out["rope_scaling"] = {"type": "linear", "rope_type": "linear", "factor": c.rope_scaling_factor}
    return out


def save_eagle_head(head, path) -> Path:
    """Save a head in the EAGLE authors' format (``config.json`` + ``model.safetensors``).

    EAGLE-1: keys ``fc.*``, ``layers.N.*``, config ``"bias"``. EAGLE-3: layer 0 as ``midlayer.*`` (further
    layers as ``layers.N.*``, which only specdec and speculators-style loaders read), ``fc``, ``norm``,
    ``lm_head``, ``d2t``, ``t2d``, config ``draft_vocab_size`` / ``target_hidden_size`` and the feature
    layers as ``eagle_aux_hidden_state_layer_ids``. Frozen target embeddings are not saved.

    Args:
        head: an :class:`~specdec.eagle.Eagle1Head` or :class:`~specdec.eagle.Eagle3Head`.
        path: output folder (created).

    Returns:
        The folder, loadable with :func:`load_eagle_head`.

    References:
        SafeAILab/EAGLE checkpoints (``yuhuili/EAGLE-*``, ``yuhuili/EAGLE3-*``).
    """
    config = _llama_config(head)
    state = head.state_dict()
    if isinstance(head, Eagle1Head):
        config["bias"] = head.config.fc_bias
    elif isinstance(head, Eagle3Head):
        c = head.config
        config.update(draft_vocab_size=c.draft_vocab, eagle_aux_hidden_state_layer_ids=list(c.feature_layers),
                      norm_before_residual=c.norm_before_residual)
        if c.target_hidden_size is not None:
            config["target_hidden_size"] = c.target_hidden_size
        state = {("midlayer." + k[len("layers.0."):]) if k.startswith("layers.0.") else k: v for k, v in state.items()}
    else:
        raise TypeError(f"expected an Eagle1Head or Eagle3Head, got {type(head).__name__}")
    return write_checkpoint(path, config, state)


def export_speculators(head, path, target_name_or_path: str, *, target_architectures=("LlamaForCausalLM",),
                       num_speculative_tokens: int = 3, include_embeddings: bool = False) -> Path:
    """Write an EAGLE-3 head in the vLLM ``speculators`` format, so ``vllm serve`` can use it.

    Only EAGLE-3 heads: the speculators format has no EAGLE-1 model type any more (its EAGLE-1/HASS
    converter was removed), and vLLM's EAGLE-1 loader builds ``fc`` without a bias. Save EAGLE-1 heads with
    :func:`save_eagle_head` instead.

    Args:
        head: an :class:`~specdec.eagle.Eagle3Head`.
        path: output folder (created).
        target_name_or_path: the verifier's hub id or path (``speculators_config.verifier.name_or_path``).
        target_architectures: the verifier's ``architectures``.
        num_speculative_tokens: ``speculative_tokens`` of the greedy proposal (vLLM's default K).
        include_embeddings: also write ``embed_tokens.weight`` (vLLM shares the target's when absent).

    Returns:
        The folder (``config.json`` + ``model.safetensors``), also loadable with :func:`load_eagle_head`.

    Example:
        >>> export_speculators(head, "out/eagle3", "meta-llama/Llama-3.1-8B-Instruct")  # doctest: +SKIP
        >>> # vllm serve meta-llama/Llama-3.1-8B-Instruct --speculative-config \\
        >>> #   '{"method": "eagle3", "model": "out/eagle3", "num_speculative_tokens": 3}'

    References:
        vllm-project/speculators (``Eagle3SpeculatorConfig``); vLLM ``SpeculatorsConfig``.
    """
    if not isinstance(head, Eagle3Head):
        raise ValueError(f"the speculators format stores EAGLE-3 heads only (got {type(head).__name__}); save an "
                         f"EAGLE-1 head in the EAGLE authors' format with save_eagle_head(head, path)")
    c = head.config
    layer_config = _llama_config(head)
    layer_config.pop("torch_dtype")
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(num_speculative_tokens),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(target_name_or_path), "architectures": list(target_architectures)},
        },
        "transformer_layer_config": layer_config,
        "draft_vocab_size": c.draft_vocab,
        "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": c.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
        "tie_word_embeddings": False,
        "torch_dtype": _dtype_name(head.dtype),
    }
    state = dict(head.state_dict())
    if include_embeddings:
        state["embed_tokens.weight"] = head.embed_weight
    return write_checkpoint(path, config, state)
