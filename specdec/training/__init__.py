"""Training: the one loop (:mod:`specdec.training.loop`) and the draft-head trainers built on it.

References:
    EAGLE arXiv 2401.15077; EAGLE-3 arXiv 2503.01840.
"""
from .dflash import (
    BlockLoss,
    DFlashTrainRecord,
    block_accuracy,
    dflash_loss,
    sample_anchors,
    train_dflash,
    train_dspark,
)
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
from .loop import FitRecord, cosine_schedule, fit, sample_windows
from .medusa import (
    LoRALinear,
    Medusa2Result,
    MedusaTrainResult,
    apply_lora,
    distillation_kl,
    medusa_loss,
    merge_lora,
    train_medusa1,
    train_medusa2,
)
from .peagle import PEagleBlock, PEagleEval, cod_counts, evaluate_peagle, peagle_block, peagle_loss, train_peagle

__all__ = [
    "FitRecord",
    "TrainRecord",
    "TrainResult",
    "build_draft_vocab",
    "cosine_schedule",
    "draft_vocab_size_for_coverage",
    "fit",
    "sample_windows",
    "token_stream",
    "train_eagle1",
    "train_eagle3",
    "ttt_forward",
]
__all__ += [
    "MedusaTrainResult", "Medusa2Result", "LoRALinear", "apply_lora", "merge_lora", "medusa_loss",
    "distillation_kl", "train_medusa1", "train_medusa2"
]
__all__ += ["PEagleBlock", "PEagleEval", "cod_counts", "evaluate_peagle", "peagle_block", "peagle_loss",
            "train_peagle"]
__all__ += ["BlockLoss", "DFlashTrainRecord", "block_accuracy", "dflash_loss", "sample_anchors", "train_dflash",
            "train_dspark"]
