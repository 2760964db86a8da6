"""Reading weight files, shared by every checkpoint format: single or sharded, safetensors or PyTorch bin."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["load_weight_file", "read_weights", "resolve_checkpoint", "write_checkpoint"]

_STANDARD = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _looks_local(name: str) -> bool:
    """Whether ``name`` can only be a local path (a hub id is ``name`` or ``owner/name``, no dots or slashes
    before it, at most one slash)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


def resolve_checkpoint(path_or_hub_id, *, what: str = "the weights",
                       patterns: Sequence[str] = ("*.json", "*.safetensors", "*.bin")) -> Path:
    """The local folder of a checkpoint: ``path_or_hub_id`` itself when it is a folder, else a Hugging Face hub
    snapshot (``huggingface_hub.snapshot_download`` of the files matching ``patterns``).

    Args:
        path_or_hub_id: a local folder or a hub id (``owner/name``).
        what: what the folder holds besides its config.json, for the error messages.
        patterns: the hub files to fetch.

    Returns:
        The folder.

    Raises:
        ValueError: the path is a file.
        FileNotFoundError: the path is clearly local (``./x``, ``/x``, ``a/b/c``) and no folder is there (instead of
            the hub's "repo id must be ..." error).
    """
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{path} is a file: give the folder that holds config.json and {what}")
    if _looks_local(str(path_or_hub_id)):
        raise FileNotFoundError(f"no folder at {path_or_hub_id} (it is not a hub id either): give the folder that "
                                f"holds config.json and {what}, e.g. the out-dir/<method>/final of a training script")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(path_or_hub_id), allow_patterns=list(patterns)))


def load_weight_file(path: Path) -> dict[str, torch.Tensor]:
    """Load one weight file (``.safetensors`` or a PyTorch pickle, read with ``weights_only=True``) on CPU.

    Args:
        path: the file.

    Returns:
        ``{key: tensor}``.

    Raises:
        ValueError: a pickle that holds something other than a state dict.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__}): save the weights with "
                         f"torch.save(module.state_dict(), path)")
    return state


def read_weights(folder, *, first: Sequence[str] = (), what: str = "weights",
                 expected: str = "model.safetensors, pytorch_model.bin or a sharded index") -> dict[str, torch.Tensor]:
    """Read the raw weights of a checkpoint folder, with the files' own key names.

    Looks for the format's own file names (``first``) in order, then a sharded index
    (``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``), then ``model.safetensors`` /
    ``pytorch_model.bin``.

    Args:
        folder: a local folder.
        first: file names of the format's own layout, tried before the standard ones.
        what: how the error names the weights (e.g. ``"Medusa weights"``).
        expected: what the error says it looked for.

    Returns:
        ``{key: tensor}`` on CPU.

    Raises:
        FileNotFoundError: no weights file in the folder (the error lists what is there).

    References:
        HF ``model.safetensors.index.json`` sharding convention.
    """
    folder = Path(folder)
    for name in first:
        if (folder / name).exists():
            return load_weight_file(folder / name)
    for index_name in _INDEXES:
        index = folder / index_name
        if index.exists():
            state: dict = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                state.update(load_weight_file(folder / shard))
            return state
    for name in _STANDARD:
        if (folder / name).exists():
            return load_weight_file(folder / name)
    found = sorted(p.name for p in folder.iterdir()) if folder.exists() else []
    raise FileNotFoundError(f"no {what} in {folder}: expected {expected}; found {found}")


def write_checkpoint(folder, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (the layout every format here saves).

    The weights go through a temporary file and an atomic rename, so an interrupted save never leaves a truncated
    ``model.safetensors`` behind.

    Args:
        folder: the checkpoint folder (created if missing).
        config: the JSON configuration.
        state: tensor name -> tensor (moved to the CPU, made contiguous and copied before writing).

    Returns:
        The folder as a ``Path``.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    tmp = folder / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
