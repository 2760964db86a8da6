"""Run a script with session 26's kernel changes undone (the A/B of call F): the float8 products' session-23 launch
configurations, top-k's two reductions per pick and 4,096-wide chunks. python before_s26.py SCRIPT ARGS..."""
import runpy
import sys

import specdec.kernels.fp8 as fp8
import specdec.kernels.topk as topk


def _config_s23(rows, n, k):
    block_k = 256 if k % 256 == 0 else 128
    programs = -(-n // 64)
    return 64, block_k, 2 if programs < 100 and k >= 8192 and k % 512 == 0 else 1, 4, 5


fp8.fp8_linear_config = _config_s23
topk.TOPK_FEW_ROWS = 0
topk._topk_rows_triton.__defaults__ = (False, False, None)  # lse, packed, chunk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
