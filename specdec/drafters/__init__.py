"""Draft generators: each proposes a tree (a chain is a tree) and says how it chose its tokens."""
from .base import Drafter, Feedback, ProposeRequest
from .draft_model import DraftModelDrafter, DraftModelState
from .eagle import EagleDrafter, EagleState
from .parallel import ParallelDrafter, ParallelHead, ParallelState, last_committed_features
from .prompt_lookup import PromptLookupDrafter, PromptLookupState

__all__ = ["Drafter", "Feedback", "ProposeRequest", "DraftModelDrafter", "DraftModelState", "EagleDrafter",
           "EagleState", "PromptLookupDrafter", "PromptLookupState"]
__all__ += ['ParallelDrafter', 'ParallelHead', 'ParallelState', 'last_committed_features']
from .parallel import LevelOutput  # noqa: E402

__all__ += ["LevelOutput"]
