"""Run a script with tree attention's shared-prefix reads off (session 24's A/B): python noprefix.py SCRIPT ARGS..."""
import runpy
import sys

import specdec.kernels  # noqa: F401  (the package exports the function under the module's name)

sys.modules["specdec.kernels.tree_attention"].TREE_ATTENTION_PREFIX_MIN_ROWS_HEADS = 1 << 30
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
