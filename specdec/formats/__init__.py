"""Load and save the public checkpoint formats of draft heads (one module per format family).

- :mod:`specdec.formats.eagle`: the EAGLE authors' EAGLE-1 / EAGLE-3 layouts, the vLLM ``speculators`` layout
  (load and :func:`export_speculators`), hub ids or local paths.
"""
from .dflash import DFlashFormatError, export_dflash_zlab, load_dflash_head, mask_token_id_of, save_dflash_head
from .eagle import export_speculators, load_eagle_head, read_state_dict, save_eagle_head
from .medusa import MedusaFormatError, MedusaMismatchError, load_medusa_head, read_medusa_state_dict, save_medusa_head
from .peagle import PEagleFormatError, load_peagle_head, save_peagle_head

__all__ = ["load_eagle_head", "save_eagle_head", "export_speculators", "read_state_dict"]
__all__ += [
    "load_medusa_head", "save_medusa_head", "read_medusa_state_dict", "MedusaMismatchError", "MedusaFormatError"
]
__all__ += ["load_peagle_head", "save_peagle_head", "PEagleFormatError"]

__all__ += ["DFlashFormatError", "load_dflash_head", "save_dflash_head", "export_dflash_zlab", "mask_token_id_of"]
