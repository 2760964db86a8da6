"""Run a script with tree attention's one-launch merge off (session 24's call A, on a version of tree_attention.py
that had TREE_ATTENTION_FUSED_MERGE; dropped after it): python nomerge.py SCRIPT ARGS..."""
import runpy
import sys

import specdec.kernels  # noqa: F401

sys.modules["specdec.kernels.tree_attention"].TREE_ATTENTION_FUSED_MERGE = False
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
