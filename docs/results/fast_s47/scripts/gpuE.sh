# Session 47, call E: the GPU tests at the landed defaults after the alignment fix (call D's run met a float8 weight
# with 1,000-byte rows: the bulk prefetch needs 16-byte aligned rows, now checked on the host).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 290 python3 -m pytest -q tests/test_kernels.py tests/test_int4.py tests/test_fp8.py tests/test_skinny.py tests/test_gpu.py tests/test_fast_path.py -k "gpu or cuda or fast or pdl" -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest: $(tail -1 $OUT/pytest.log | cut -c1-200)"; grep -m8 "^FAILED\|^ERROR" $OUT/pytest.log | cut -c1-300
tail -3 $OUT/pytest.log | cut -c1-200; true
