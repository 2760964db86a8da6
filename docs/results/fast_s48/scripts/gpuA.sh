# Session 48, call A: host vs device time of the 7B gate's steps (host_gap.py), then the GPU tests not yet run at
# session 47's landed code (test_gpu.py, test_fast_path.py), with durations.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 docs/results/fast_s48/scripts/host_gap.py 20 > $OUT/host_gap.log 2>&1
grep -v Warning $OUT/host_gap.log | tail -8
timeout 300 python3 -m pytest -q tests/test_gpu.py tests/test_fast_path.py -p no:cacheprovider --durations=12 > $OUT/pytest.log 2>&1
echo "pytest: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED\|^ERROR" $OUT/pytest.log | cut -c1-300
grep -A14 "slowest" $OUT/pytest.log | cut -c1-160; tail -2 $OUT/pytest.log | cut -c1-200; true
