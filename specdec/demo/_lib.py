"""Every library name the demo application uses, imported in one place.

The demo is an application *on* the library: nothing under ``specdec/`` outside ``specdec/demo/`` imports it.
When library modules move (e.g. EAGLE heads to ``specdec.heads``), only this file changes.
"""
from ..drafters import DraftModelDrafter, PromptLookupDrafter
from ..formats import load_eagle_head, save_eagle_head
from ..generate import generate
from ..heads import Eagle1Head
from ..recipes import eagle2
from ..training import cosine_schedule, fit, sample_windows, train_eagle1

__all__ = ["DraftModelDrafter", "Eagle1Head", "PromptLookupDrafter", "cosine_schedule", "eagle2", "fit",
           "generate", "load_eagle_head", "sample_windows", "save_eagle_head", "train_eagle1"]
