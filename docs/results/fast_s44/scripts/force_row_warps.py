"""Session 44: examples/bench_fast_7b.py with the one-program-per-row kernels launched with ROW_WARPS's warps
(``silu,embed,quant,norm``; 0 keeps the library's) wherever they are launched.
    ROW_WARPS=16,16,0,0 python docs/results/fast_s44/scripts/force_row_warps.py BENCH_ARGS..."""
import os
import sys

sys.path.insert(0, "examples")
import bench_fast_7b  # noqa: E402

from specdec.kernels import decoder_ops, fp8  # noqa: E402


class Warps:
    def __init__(self, kernel, warps):
        self.kernel, self.warps = kernel, warps

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kw: launch(*args, **{**kw, "num_warps": self.warps})


silu, embed, quant, norm = (int(v) for v in os.environ["ROW_WARPS"].split(","))
for module, name, warps in ((decoder_ops, "_silu_mul_kernel", silu), (decoder_ops, "_embed_concat_kernel", embed),
                            (fp8, "_quant_rows_kernel", quant), (decoder_ops, "_add_rms_norm_kernel", norm)):
    if warps:
        setattr(module, name, Warps(getattr(module, name), warps))
print("row kernels' warps (silu, embed, quant, norm; 0 = library):", (silu, embed, quant, norm), flush=True)
bench_fast_7b.main(sys.argv[1:])
