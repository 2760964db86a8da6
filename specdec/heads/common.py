"""What every head needs to know about its target: HF config introspection shared by the heads."""
from __future__ import annotations

__all__ = ["text_config", "target_dims"]


def text_config(target) -> object:
    """The text model's config of an HF model (multimodal configs nest it; plain ones are it).

    Args:
        target: an HF model.

    Returns:
        ``target.config.get_text_config()`` where it exists, else ``target.config``.
    """
    config = target.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def target_dims(target) -> tuple[int, int, int]:
    """The sizes of an HF causal LM a draft head must match.

    Args:
        target: an HF causal LM (``config.hidden_size``, ``config.num_hidden_layers``, input embeddings).

    Returns:
        ``(hidden_size, num_hidden_layers, vocab_size)``; the vocabulary is the number of rows of the input
        embedding matrix.

    References:
        HF ``PreTrainedModel.get_input_embeddings``.
    """
    config = text_config(target)
    vocab = target.get_input_embeddings().weight.shape[0]
    return int(config.hidden_size), int(config.num_hidden_layers), int(vocab)
