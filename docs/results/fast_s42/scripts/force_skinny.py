"""Session 42: examples/bench_fast_7b.py with the verify's linear tuning restricted to the skinny kernel's launches
(F.linear timed but never picked), so that every 64-row projection stays in the chain of PDL launches.
    python docs/results/fast_s42/scripts/force_skinny.py BENCH_ARGS..."""
import sys

sys.path.insert(0, "examples")
import bench_fast_7b  # noqa: E402

from specdec.kernels import tuning  # noqa: E402


def skinny_only(times, default, margin=tuning.TUNE_MARGIN):
    launches = {key: t for key, t in times.items() if key is not None}
    return min(launches, key=launches.get) if launches else default


tuning.pick_fastest = skinny_only
bench_fast_7b.main(sys.argv[1:])
