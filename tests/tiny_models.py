"""Shared test fixtures: tiny HF causal LMs built from configs (nothing downloaded), noisy draft copies,
random per-row tree forests."""
from __future__ import annotations

import copy

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


def noisy_copy(model: torch.nn.Module, noise: float, seed: int = 0) -> torch.nn.Module:
    """A draft that agrees with ``model`` often but not always: its weights plus relative Gaussian noise."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device) * noise * p.std().clamp(min=1e-3))
    return draft


def random_forest(rng, batch: int, num_nodes: int, p_absent: float = 0.3) -> torch.Tensor:
    """Parents ``[B, N + 1]``: each row its own random tree, absent nodes (-1) anywhere after the root."""
    rows = []
    for _ in range(batch):
        parents, present = [-1], [0]
        for i in range(1, num_nodes + 1):
            if rng.random() < p_absent:
                parents.append(-1)
            else:
                parents.append(rng.choice(present))
                present.append(i)
        rows.append(parents)
    return torch.tensor(rows)


def assert_replay_equals_a_call(fn, x: torch.Tensor, fresh: torch.Tensor) -> None:
    """Capture ``fn()`` (which reads ``x``) in a CUDA graph after a warm-up on a side stream, copy ``fresh`` into
    ``x``, replay, and assert that the graph's output equals a plain call of ``fn()`` on the new ``x``, bit for bit
    (the same kernels sum in the same order)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fn())
