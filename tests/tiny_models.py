"""Tiny HF causal LMs built from configs (nothing downloaded), shared by the tests."""
from __future__ import annotations

import torch
import transformers

VOCAB = 97

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=512)

ARCHITECTURES = {
    "llama": lambda: transformers.LlamaConfig(**_COMMON, num_key_value_heads=2),
    "mistral": lambda: transformers.MistralConfig(**_COMMON, num_key_value_heads=2, sliding_window=None),
    "qwen2": lambda: transformers.Qwen2Config(**_COMMON, num_key_value_heads=2, use_sliding_window=False),
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=16,
                                              use_sliding_window=False),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**_COMMON),
    "phi3": lambda: transformers.Phi3Config(**_COMMON, num_key_value_heads=2, pad_token_id=0),
    "gemma": lambda: transformers.GemmaConfig(**_COMMON, num_key_value_heads=2, head_dim=16),
}


def tiny_model(arch: str = "llama", seed: int = 0, attn: str = "sdpa", *, layers: int | None = None,
               hidden: int | None = None, scale: float = 1.0) -> torch.nn.Module:
    """A float32 causal LM of the given architecture with random weights (``scale`` sharpens its logits)."""
    config = ARCHITECTURES[arch]()
    if layers is not None:
        config.num_hidden_layers = layers
    if hidden is not None:
        config.hidden_size = hidden
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    if scale != 1.0:
        with torch.no_grad():
            out = model.get_output_embeddings()
            if out.weight is model.get_input_embeddings().weight:
                raise ValueError("tied embeddings: scale would change inputs too")
            out.weight.mul_(scale)
    return model.eval()
