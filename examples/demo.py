"""Speculative decoding demo on held-out Python code; a thin wrapper around ``specdec.demo.main``.

    python examples/demo.py                      # train (or load) the demo models, then decode
    python examples/demo.py --model PATH --draft PATH --device cuda
"""
import sys
from pathlib import Path

try:
    import specdec  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.demo import main

if __name__ == "__main__":
    sys.exit(main())
