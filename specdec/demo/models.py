"""The demo's shipped models and prompts: what they are, and how to load them in a second.

``specdec/demo/assets/`` holds what :func:`specdec.demo.build.build_demo_models` wrote (``python -m specdec.demo
--train`` writes the same layout elsewhere):

- ``target/``: a 4-layer Llama (``save_pretrained`` format, tokenizer included) trained on the standard library;
- ``draft/``: its embeddings and first layer, distilled from it (a draft model for SpS);
- ``eagle1/``: an EAGLE-1 head trained against the target (``save_eagle_head`` format);
- ``prompts.jsonl``: code-completion prompts cut from held-out standard-library files (``source``, ``prompt``,
  ``reference``), shipped so that results do not depend on the running Python's standard library;
- ``build.json``: the :class:`DemoReport` of the build (sizes, steps, losses, timings).
"""
from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = ["ASSETS", "DemoModels", "DemoPrompt", "DemoReport", "demo_prompts", "load_demo_models",
           "trim_to_tokens"]

ASSETS = Path(__file__).resolve().parent / "assets"


class DemoPrompt(NamedTuple):
    """A code-completion prompt cut from a held-out file just after a ``def`` line.

    Attributes:
        source: the file, relative to the standard library it came from.
        prompt: the code up to and including the ``def`` line (no trailing newline).
        reference: the code that followed it in the file.
    """

    source: str
    prompt: str
    reference: str


class DemoReport(NamedTuple):
    """What a build of the demo models measured (``build.json``).

    Attributes:
        python_version: the Python whose standard library was the corpus.
        num_train_files: training files.
        num_heldout_files: held-out files (prompts and held-out losses come from them only).
        num_train_tokens: tokens in the training stream.
        target_loss: held-out cross-entropy of the target, nats per token.
        draft_loss: the same for the draft.
        draft_agreement: fraction of held-out positions where the draft's argmax equals the target's.
        head_agreement: fraction of held-out positions where the EAGLE head's top-1 (one step ahead, from the
            target's own feature) equals the target's.
        target_steps: optimiser steps the target took (fewer than asked when a time budget ran out).
        draft_steps: the same for the draft's distillation.
        head_steps: the same for the EAGLE head.
        tokenizer_seconds: seconds to read the corpus, train the tokenizer and encode.
        target_seconds: seconds to train the target.
        draft_seconds: seconds to distil the draft.
        head_seconds: seconds to train the EAGLE head.
        total_seconds: seconds for the whole build.
        weights_dtype: the dtype the weights are stored in.
        settings: the :class:`~specdec.demo.build.DemoSettings` used, as a dict.
    """

    python_version: str
    num_train_files: int
    num_heldout_files: int
    num_train_tokens: int
    target_loss: float
    draft_loss: float
    draft_agreement: float
    head_agreement: float
    target_steps: int
    draft_steps: int
    head_steps: int
    tokenizer_seconds: float
    target_seconds: float
    draft_seconds: float
    head_seconds: float
    total_seconds: float
    weights_dtype: str
    settings: dict


class DemoModels(NamedTuple):
    """The demo's target, draft, tokenizer, EAGLE-1 head and prompts, ready to decode.

    Attributes:
        target: the target ``LlamaForCausalLM`` (eval mode).
        draft: the draft ``LlamaForCausalLM`` (same vocabulary).
        tokenizer: the byte-level BPE as a ``PreTrainedTokenizerFast``.
        eagle_head: an :class:`~specdec.heads.Eagle1Head` bound to ``target``.
        prompts: every shipped :class:`DemoPrompt`, untrimmed.
        report: the :class:`DemoReport` of the build.
        path: the folder they were loaded from.
    """

    target: Any
    draft: Any
    tokenizer: Any
    eagle_head: Any
    prompts: tuple
    report: DemoReport
    path: Path

    def heldout_prompts(self, n: int, prompt_tokens: int = 256) -> list[DemoPrompt]:
        """:func:`demo_prompts` with this demo's tokenizer and prompts.

        Args:
            n: how many prompts (at most).
            prompt_tokens: the most tokens a prompt may have.

        Returns:
            A list of :class:`DemoPrompt`.
        """
        return demo_prompts(n, prompt_tokens, tokenizer=self.tokenizer, prompts=self.prompts)


@contextlib.contextmanager
def hf_progress_bars_off():
    """Silence transformers' own load/save progress bars for a moment (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


_LAYOUT = ("target", "draft", "eagle1", "prompts.jsonl", "build.json")


def _folder(path, needs: tuple[str, ...] = _LAYOUT) -> Path:
    folder = ASSETS if path is None else Path(path)
    missing = [name for name in needs if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"{folder} lacks the demo's {', '.join(missing)}: point path= at a folder written by "
            "`python -m specdec.demo --train`, or reinstall specdec with its package data (setup.cfg "
            "[options.package_data])"
        )
    return folder


def read_prompts(path=None) -> tuple[DemoPrompt, ...]:
    """The prompts of ``prompts.jsonl`` (untrimmed).

    Args:
        path: a demo-models folder (default: the shipped one).

    Returns:
        A tuple of :class:`DemoPrompt`.
    """
    lines = (_folder(path, ("prompts.jsonl",)) / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    return tuple(DemoPrompt(**{k: row[k] for k in DemoPrompt._fields}) for row in map(json.loads, lines) if row)


def load_demo_tokenizer(path=None):
    """The demo's tokenizer alone (a ``PreTrainedTokenizerFast``), without loading any model.

    Args:
        path: a demo-models folder (default: the shipped one).

    Returns:
        The tokenizer.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(_folder(path, ("target",)) / "target")


def load_demo_models(device="cpu", dtype: torch.dtype = torch.float32, *, path=None) -> DemoModels:
    """Load the demo's shipped target, draft, EAGLE-1 head, tokenizer and prompts (about a second).

    The weights are stored in bfloat16 (half the package size) and upcast to ``dtype``. Float32 is the default
    because bf16 matmuls on a CPU are slow, and because float32 is where speculative greedy output is
    guaranteed token-identical to plain greedy decoding (in bf16 the tree forward and the one-token forward
    may round differently).

    Args:
        device: where to put the models.
        dtype: compute dtype of the models and head.
        path: a folder written by ``python -m specdec.demo --train`` (default: the shipped
            ``specdec/demo/assets``).

    Returns:
        :class:`DemoModels`, models in eval mode.

    Example:
        >>> demo = load_demo_models()                               # doctest: +SKIP
        >>> ids = demo.tokenizer(demo.heldout_prompts(1)[0].prompt, return_tensors="pt").input_ids  # doctest: +SKIP
    """
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from ._lib import load_eagle_head

    folder = _folder(path)
    with hf_progress_bars_off():
        target = AutoModelForCausalLM.from_pretrained(folder / "target", dtype=dtype).to(device).eval()
        draft = AutoModelForCausalLM.from_pretrained(folder / "draft", dtype=dtype).to(device).eval()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder / "target")
    head = load_eagle_head(folder / "eagle1", target, dtype=dtype, device=device)
    report = DemoReport(**json.loads((folder / "build.json").read_text()))
    return DemoModels(target, draft, tokenizer, head, read_prompts(folder), report, folder)


def _counter(tokenizer):
    # A fast tokenizer's backend counts without the "sequence longer than model_max_length" warning.
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda text: len(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def trim_to_tokens(text: str, max_tokens: int, count) -> str | None:
    """The longest suffix of ``text`` that starts at a line start and has at most ``max_tokens`` tokens.

    Args:
        text: the text to trim from the left.
        max_tokens: the most tokens kept.
        count: ``count(text) -> int``, the token count.

    Returns:
        The suffix, or ``None`` when even the last line is longer than ``max_tokens``.
    """
    if count(text) <= max_tokens:
        return text
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    lo, hi = 0, len(starts) - 1
    if count(text[starts[hi]:]) > max_tokens:
        return None
    # Token counts shrink as the start moves right; binary search the first line start that fits.
    while lo < hi:
        mid = (lo + hi) // 2
        if count(text[starts[mid]:]) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    return text[starts[lo]:]


def demo_prompts(n: int, prompt_tokens: int = 256, *, tokenizer=None, prompts=None,
                 min_prompt_tokens: int | None = None) -> list[DemoPrompt]:
    """The first ``n`` shipped held-out prompts, each trimmed from the left (at a line start) to a token budget.

    Args:
        n: how many prompts (fewer when not enough fit).
        prompt_tokens: the most tokens a prompt may have, as ``tokenizer`` counts them (no special tokens).
        tokenizer: counts tokens (default: the demo's; pass your model's tokenizer for your model).
        prompts: the prompts to trim (default: the shipped ``prompts.jsonl``).
        min_prompt_tokens: skip prompts left shorter than this; default ``min(64, prompt_tokens // 2)``.

    Returns:
        A list of :class:`DemoPrompt` (``source`` and ``reference`` unchanged).
    """
    if n < 1 or prompt_tokens < 1:
        raise ValueError(f"n and prompt_tokens must be >= 1, got n={n}, prompt_tokens={prompt_tokens}")
    prompts = read_prompts() if prompts is None else prompts
    count = _counter(load_demo_tokenizer() if tokenizer is None else tokenizer)
    least = min(64, prompt_tokens // 2) if min_prompt_tokens is None else min_prompt_tokens
    out: list[DemoPrompt] = []
    for p in prompts:
        text = trim_to_tokens(p.prompt, prompt_tokens, count)
        if text is not None and count(text) >= least:
            out.append(p._replace(prompt=text))
            if len(out) == n:
                break
    return out
