"""The demo application: speculative decoding on held-out Python code with small models shipped in the package.

Run ``python -m specdec.demo`` (``--help`` for options): it loads the shipped target, draft and EAGLE-1 head
(:func:`load_demo_models`, about a second) and prints a table of plain decoding, a draft model, prompt lookup and
EAGLE-2, row by row, then a sample and timing notes. ``--train`` rebuilds the models from the running Python's
standard library first (:mod:`specdec.demo.build`).

This package is an application *on* the library: nothing else under ``specdec/`` imports it. Notebooks, docs and
tests use it for small real models::

    from specdec.demo import load_demo_models
    demo = load_demo_models()                        # target, draft, tokenizer, eagle_head, prompts, report
    prompts = demo.heldout_prompts(4, prompt_tokens=256)
"""
from .build import DemoSettings, build_demo_models
from .cli import main
from .models import DemoModels, DemoPrompt, DemoReport, demo_prompts, load_demo_models

__all__ = ["DemoModels", "DemoPrompt", "DemoReport", "DemoSettings", "build_demo_models", "demo_prompts",
           "load_demo_models", "main"]
