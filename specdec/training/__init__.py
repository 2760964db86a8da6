"""Training of draft heads against any HF causal LM (online: the frozen target runs inside each step).

References:
    EAGLE arXiv 2401.15077; EAGLE-3 arXiv 2503.01840.
"""
from .eagle import (
    TrainRecord,
    TrainResult,
    build_draft_vocab,
    draft_vocab_size_for_coverage,
    token_stream,
    train_eagle1,
    train_eagle3,
    ttt_forward,
)

__all__ = ["TrainRecord", "TrainResult", "build_draft_vocab", "draft_vocab_size_for_coverage", "token_stream",
           "ttt_forward", "train_eagle1", "train_eagle3"]
