"""Session 44: tree attention with many key chunks per head and all 64 queries of the batch-1 verify in one program
(each program one or two tiles, every key read once), the merge fused or not, beside the plan; and an EAGLE head's
level with 8 or 16 chunks. Session 43's ``attn_sweep.py`` does the set-up and the timing (keys L2-cold, CUDA-graph
replays, us per call; a sixth field of a launch is ``fused_merge``).

    python docs/results/fast_s44/scripts/attn_splits.py OUT.json
"""
import importlib.util
import itertools
import os

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("attn_sweep", os.path.join(here, "..", "..", "fast_s43", "scripts",
                                                                          "attn_sweep.py"))
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)  # reads OUT.json from argv; runs nothing at import

fused = (False, True)
sweep.case("verify, batch 1: 61 nodes, 573 live of 1216", 32, 1216, 64, 573, 61, True,
           list(itertools.product((64,), (6, 8, 9, 12), (32, 64), (4, 8), (1, 2), fused))
           + list(itertools.product((32,), (2, 4, 8), (64,), (4, 8), (1, 3), fused)))
sweep.case("head level, batch 1: 10 nodes over a 1024-slot cache", 32, 1024, 10, 640, 50, False,
           itertools.product((16,), (8, 16), (64,), (4,), (1, 2), fused))
