"""Load and save Medusa heads in the layouts users have: the Medusa authors' and vLLM's.

==============================  =======================================================================
Medusa authors (Medusa-1)       ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
(``FasterDecoding/medusa-*``)   ``base_model_name_or_path``) + ``medusa_lm_head.pt`` (a torch state dict)
                                or ``medusa_lm_head.safetensors``; keys ``{h}.{l}.linear.weight|bias``
                                (residual block ``l`` of head ``h``) and ``{h}.{L}.weight`` (head ``h``'s
                                vocabulary projection, ``L`` = blocks per head).
Medusa authors, shared          the same without ``{h}.{L}.weight``: the heads reuse the base model's
``lm_head`` (their PR #97)      ``lm_head`` (config ``"version": "2"``).
Medusa-2 full model             base weights and ``medusa_head.{h}...`` keys in one checkpoint: only the
                                ``medusa_head.`` keys are read (load the fine-tuned base model itself with
                                ``AutoModelForCausalLM``).
vLLM (``model_type: medusa``)   config ``num_heads``, ``num_hidden_layers``, ``hidden_size``,
                                ``vocab_size``, ``medusa_fc_bias`` (default False), ``original_lm_head``,
                                ``truncated_vocab_size``; keys ``blocks.{h}.layers.{l}.weight|bias``,
                                ``lm_heads.{h}.weight`` (or one ``lm_head.weight`` with
                                ``original_lm_head``); a ``medusa_heads.`` prefix is stripped.
==============================  =======================================================================

The number of heads and of blocks is read from the weights, never trusted from the config: the authors' uploaded
``medusa-vicuna-7b-v1.3`` config says 2 heads while its weights hold 5 (a warning names the disagreement). A head
made for another hidden size or vocabulary is refused with :class:`MedusaMismatchError` naming both sizes.
Reduced draft vocabularies (vLLM's ``token_map``) are refused as not implemented.

References:
    Medusa arXiv 2401.10774; FasterDecoding/Medusa (``medusa_model.py``, ``medusa_model_legacy.py``,
    ``train_legacy.py``); vLLM ``model_executor/models/medusa.py`` and ``transformers_utils/configs/medusa.py``.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch

from ..heads.medusa import MedusaConfig, MedusaHead, medusa_target_dims
from .common import read_weights, resolve_checkpoint

__all__ = ["load_medusa_head", "save_medusa_head", "read_medusa_state_dict", "MedusaMismatchError",
           "MedusaFormatError"]

_AUTHORS_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
_AUTHORS_PROJ = re.compile(r"^(\d+)\.(\d+)\.weight$")
_VLLM_BLOCK = re.compile(r"^blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
_VLLM_PROJ = re.compile(r"^lm_heads\.(\d+)\.weight$")
_WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "medusa_lm_head.bin")


class MedusaMismatchError(ValueError):
    """The Medusa heads were made for a target of another hidden size or vocabulary."""


class MedusaFormatError(ValueError):
    """The checkpoint is not a Medusa checkpoint specdec can read (keys, shapes or variant)."""


# --------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------


def read_medusa_state_dict(folder) -> dict[str, torch.Tensor]:
    """Read the raw Medusa weights of a checkpoint folder, with the file's own key names.

    Looks for ``medusa_lm_head.safetensors`` / ``.pt`` / ``.bin`` (the authors'), then ``model.safetensors`` /
    ``pytorch_model.bin`` (vLLM's, or a Medusa-2 full model), single or sharded (``*.index.json``).

    Args:
        folder: a local folder.

    Returns:
        ``{key: tensor}`` on CPU.

    Raises:
        FileNotFoundError: no weights file in the folder.
    """
    try:
        return read_weights(folder, first=_WEIGHT_FILES, what="Medusa weights",
                            expected="medusa_lm_head.safetensors / .pt (Medusa authors) or model.safetensors (vLLM)")
    except ValueError as e:  # a pickle without a state dict
        raise MedusaFormatError(str(e)) from None


def _strip_prefixes(state: dict) -> dict:
    for prefix in ("medusa_head.", "medusa_heads."):
        if any(k.startswith(prefix) for k in state):
            # a Medusa-2 full model (base weights + heads) or a prefixed vLLM checkpoint: keep the heads only
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return dict(state)


def _count(ids: set, what: str) -> int:
    if ids != set(range(len(ids))):
        raise MedusaFormatError(f"the checkpoint's {what} are numbered {sorted(ids)}, not 0..n-1")
    return len(ids)


def _parse(state: dict, config: dict) -> tuple[str, dict]:
    """Detect the layout and return (layout, parts) with stacked tensors."""
    authors = {k: _AUTHORS_BLOCK.match(k) for k in state}
    vllm = {k: _VLLM_BLOCK.match(k) for k in state}
    if any(authors.values()):
        layout, blocks = "medusa", {k: m for k, m in authors.items() if m}
    elif any(vllm.values()):
        layout, blocks = "vllm", {k: m for k, m in vllm.items() if m}
    else:
        raise MedusaFormatError(f"no Medusa residual blocks in the checkpoint (expected keys "
                                f"'{{h}}.{{l}}.linear.weight' (Medusa authors) or 'blocks.{{h}}.layers.{{l}}.weight' "
                                f"(vLLM)); found keys {sorted(state)[:8]}")
    num_heads = _count({int(m.group(1)) for m in blocks.values()}, "heads")
    num_layers = _count({int(m.group(2)) for m in blocks.values()}, "residual blocks")
    weights = [[None] * num_layers for _ in range(num_heads)]
    biases = [[None] * num_layers for _ in range(num_heads)]
    for key, m in blocks.items():
        (weights if m.group(3) == "weight" else biases)[int(m.group(1))][int(m.group(2))] = state[key]
    if any(w is None for row in weights for w in row):
        raise MedusaFormatError("a residual block of the checkpoint has a bias but no weight")
    has_bias = [b is not None for row in biases for b in row]
    if any(has_bias) and not all(has_bias):
        raise MedusaFormatError("some residual blocks of the checkpoint have biases and others do not")
    parts = {"num_heads": num_heads, "num_layers": num_layers,
             "block_weight": torch.stack([torch.stack(row) for row in weights]),
             "block_bias": torch.stack([torch.stack(row) for row in biases]) if all(has_bias) else None}
    used = set(blocks)
    if layout == "medusa":
        proj = {int(m.group(1)): k for k in state for m in [_AUTHORS_PROJ.match(k)]
                if m and int(m.group(2)) == num_layers}
    else:
        proj = {} if config.get("original_lm_head") else {
            int(m.group(1)): k for k in state for m in [_VLLM_PROJ.match(k)] if m}
    if proj:
        if set(proj) != set(range(num_heads)):
            raise MedusaFormatError(f"the checkpoint has vocabulary projections for heads {sorted(proj)} but residual "
                                    f"blocks for heads 0..{num_heads - 1}")
        parts["lm_head_weight"] = torch.stack([state[proj[h]] for h in range(num_heads)])
        used |= set(proj.values())
    else:
        parts["lm_head_weight"] = None  # the shared layout: the target's lm_head is used
        used |= {k for k in ("lm_head.weight", "lm_heads.0.weight") if k in state}
        shared = state.get("lm_head.weight", state.get("lm_heads.0.weight"))
        parts["shared_vocab"] = int(shared.shape[0]) if shared is not None else None
    if "token_map" in state:
        raise MedusaFormatError("this checkpoint has a token_map (vLLM's reduced draft vocabulary), which specdec does "
                                "not implement: use heads over the full vocabulary")
    unexpected = sorted(set(state) - used)
    if unexpected:
        raise MedusaFormatError(f"unexpected keys in the Medusa checkpoint: {unexpected[:8]}")
    return layout, parts


def _config_heads(config: dict) -> int | None:
    for key in ("medusa_num_heads", "num_heads"):
        if key in config:
            return int(config[key])
    return None


def load_medusa_head(path_or_hub_id, target, *, dtype: torch.dtype | None = None, device=None) -> MedusaHead:
    """Load Medusa heads for ``target`` from the Medusa authors' or vLLM's layout.

    Args:
        path_or_hub_id: a local folder, or a Hugging Face hub id (downloaded with
            ``huggingface_hub.snapshot_download``), e.g. ``"FasterDecoding/medusa-vicuna-7b-v1.3"``.
        target: the HF causal LM the heads were trained for (its ``lm_head`` is shared by heads without their own
            projections; its sizes are checked).
        dtype: default: the target's.
        device: default: the target's.

    Returns:
        A :class:`~specdec.heads.MedusaHead` in eval mode.

    Raises:
        MedusaMismatchError: the heads were made for another hidden size or vocabulary (both sizes named).
        MedusaFormatError: the keys are not a Medusa layout, or it is an unsupported variant (``token_map``).

    Example:
        >>> head = load_medusa_head("FasterDecoding/medusa-vicuna-7b-v1.3", vicuna)  # doctest: +SKIP
        >>> drafter = specdec.recipes.medusa(head)                                   # doctest: +SKIP

    References:
        FasterDecoding/Medusa (``MedusaModel.from_pretrained``; the 7B config's head count is wrong); vLLM
        ``Medusa.load_weights``.
    """
    folder = resolve_checkpoint(path_or_hub_id, what="the Medusa weights",
                                patterns=("*.json", "*.safetensors", "*.bin", "*.pt"))
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    layout, parts = _parse(_strip_prefixes(read_medusa_state_dict(folder)), config)
    hidden, layers, vocab = medusa_target_dims(target)
    made_for = int(parts["block_weight"].shape[-1])
    if tuple(parts["block_weight"].shape[-2:]) != (made_for, made_for):
        raise MedusaFormatError(f"the residual blocks' weights have shape {tuple(parts['block_weight'].shape[-2:])}; "
                                f"Medusa blocks are square [H, H]")
    if made_for != hidden:
        raise MedusaMismatchError(f"these Medusa heads were made for a target with hidden size {made_for} but the "
                                  f"target has hidden size {hidden}: load heads trained for this target (or train "
                                  f"them with specdec.training.train_medusa1)")
    if parts["lm_head_weight"] is not None:
        head_vocab = int(parts["lm_head_weight"].shape[1])
    else:
        head_vocab = parts.get("shared_vocab") or int(config.get("vocab_size") or vocab)
    if head_vocab != vocab:
        raise MedusaMismatchError(f"these Medusa heads were made for a vocabulary of {head_vocab} tokens but the "
                                  f"target has {vocab}: heads and target must share one tokenizer")
    truncated = config.get("truncated_vocab_size")
    if truncated is not None and int(truncated) != head_vocab:
        raise MedusaFormatError(f"this checkpoint drafts over a truncated vocabulary of {truncated} tokens (vLLM's "
                                f"token_map), which specdec does not implement")
    declared = _config_heads(config)
    if declared is not None and declared != parts["num_heads"]:
        warnings.warn(f"the Medusa config says {declared} heads but the weights hold {parts['num_heads']}; using the "
                      f"weights (the authors' medusa-vicuna-7b-v1.3 config has the same mistake)", stacklevel=2)
    mconfig = MedusaConfig(hidden_size=hidden, vocab_size=vocab, feature_layer=layers, num_heads=parts["num_heads"],
                           num_layers=parts["num_layers"], shared_lm_head=parts["lm_head_weight"] is None,
                           bias=parts["block_bias"] is not None)
    out = target.get_output_embeddings()
    head = MedusaHead(mconfig, out.weight if mconfig.shared_lm_head else None,
                      getattr(out, "bias", None) if mconfig.shared_lm_head else None)
    state = {"block_weight": parts["block_weight"]}
    if parts["block_bias"] is not None:
        state["block_bias"] = parts["block_bias"]
    if parts["lm_head_weight"] is not None:
        state["lm_head_weight"] = parts["lm_head_weight"]
    head.load_state_dict(state, strict=True)
    if dtype is None:
        dtype = out.weight.dtype
    if device is None:
        device = out.weight.device
    return head.to(device=device, dtype=dtype).eval()


# --------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------


def _tensors(head: MedusaHead, layout: str) -> dict:
    c = head.config
    state = {}
    for h in range(c.num_heads):
        for layer in range(c.num_layers):
            prefix = f"{h}.{layer}.linear." if layout == "medusa" else f"blocks.{h}.layers.{layer}."
            state[prefix + "weight"] = head.block_weight[h, layer]
            if head.block_bias is not None:
                state[prefix + "bias"] = head.block_bias[h, layer]
        if not c.shared_lm_head:
            key = f"{h}.{c.num_layers}.weight" if layout == "medusa" else f"lm_heads.{h}.weight"
            state[key] = head.lm_head_weight[h]
    if c.shared_lm_head and layout == "vllm":
        state["lm_head.weight"] = head.lm_head_weight  # vLLM loads the shared projection from the draft checkpoint
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def save_medusa_head(head: MedusaHead, path, *, layout: str = "medusa", base_model_name_or_path: str | None = None,
                     weights_format: str = "safetensors") -> Path:
    """Save Medusa heads in the Medusa authors' layout (default) or vLLM's.

    Args:
        head: a :class:`~specdec.heads.MedusaHead`.
        path: output folder (created).
        layout: ``"medusa"``: ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
            ``base_model_name_or_path``) + ``medusa_lm_head.safetensors`` (or ``.pt``) with keys
            ``{h}.{l}.linear.weight|bias`` and ``{h}.{L}.weight``; ``"vllm"``: ``config.json`` with
            ``model_type: medusa`` + ``model.safetensors`` with ``blocks.{h}.layers.{l}.*`` and ``lm_heads.{h}.weight``
            (shared heads: ``original_lm_head`` and one ``lm_head.weight``), for
            ``vllm serve --speculative-config '{"method": "medusa", "model": path, ...}'``.
        base_model_name_or_path: the target's hub id or path, recorded in the config.
        weights_format: ``"safetensors"`` or ``"pt"`` (a torch pickle, as the authors' ``medusa_lm_head.pt``);
            the vLLM layout is always safetensors.

    Returns:
        The folder, loadable with :func:`load_medusa_head`.

    References:
        FasterDecoding/Medusa (``train_legacy.py`` saves ``medusa_lm_head.safetensors`` + ``config.json``); vLLM
        ``MedusaConfig``.
    """
    if not isinstance(head, MedusaHead):
        raise TypeError(f"expected a MedusaHead, got {type(head).__name__}")
    if layout not in ("medusa", "vllm"):
        raise ValueError(f"layout must be 'medusa' (the authors') or 'vllm', got {layout!r}")
    if weights_format not in ("safetensors", "pt"):
        raise ValueError(f"weights_format must be 'safetensors' or 'pt', got {weights_format!r}")
    c = head.config
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(head, layout)
    if layout == "medusa":
        config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers,
                  "base_model_name_or_path": base_model_name_or_path, "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size}
        if c.shared_lm_head:
            config["version"] = "2"
        name = "medusa_lm_head.safetensors" if weights_format == "safetensors" else "medusa_lm_head.pt"
    else:
        config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": c.hidden_size,
                  "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
                  "max_paths": 64, "topk": 10, "truncated_vocab_size": c.vocab_size, "medusa_fc_bias": c.bias,
                  "original_lm_head": c.shared_lm_head, "base_model_name_or_path": base_model_name_or_path}
        name = "model.safetensors"
    for stale in (*_WEIGHT_FILES, "model.safetensors"):
        if stale != name and (folder / stale).exists():
            (folder / stale).unlink()  # one weights file per folder, so the loader cannot pick a stale one
    tmp = folder / (name + ".tmp")
    if name.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(tensors, str(tmp), metadata={"format": "pt"})
    else:
        torch.save(tensors, str(tmp))
    os.replace(tmp, folder / name)
    config["torch_dtype"] = str(head.dtype).replace("torch.", "")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
