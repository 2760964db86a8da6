"""Draft heads: small networks that read the target's features and propose tokens.

- EAGLE-1 / EAGLE-3 (:mod:`specdec.heads.eagle`): autoregressive feature-level heads, one forward per tree level.
- :mod:`specdec.heads.common`: what every head reads from its target (:func:`target_dims`).

Heads are built from the shared layers of :mod:`specdec.nn`. Loading and saving the public checkpoint formats is
in :mod:`specdec.formats`; training in :mod:`specdec.training`; the methods built from them in
:mod:`specdec.recipes`.
"""
from .common import target_dims, text_config
from .dflash import DFlashConfig, DFlashHead, DFlashState, DSparkHead, default_dflash_layers
from .eagle import Eagle1Head, Eagle3Head, EagleConfig, HeadCache, check_draft_vocab, default_feature_layers
from .medusa import MedusaConfig, MedusaHead, medusa_target_dims
from .peagle import PEagleConfig, PEagleHead, PEagleState, peagle_feature_layers

__all__ = ["Eagle1Head", "Eagle3Head", "EagleConfig", "HeadCache", "check_draft_vocab", "default_feature_layers",
           "target_dims", "text_config"]
__all__ += ['MedusaConfig', 'MedusaHead', 'medusa_target_dims']
__all__ += ["PEagleConfig", "PEagleHead", "PEagleState", "peagle_feature_layers"]

__all__ += ["DFlashConfig", "DFlashHead", "DFlashState", "DSparkHead", "default_dflash_layers"]
