# Session 50, call C: the heads' prefetch at 128 bytes a row (the new default) against 512 (the old) and others,
# inside the 7B step in one process (4-bit head; float8 head; 4-bit head with 8 steps queued), then the gate as
# bench_fast_7b.py times it (two processes from an idle device, two with 8 steps queued), then the GPU tests of
# the products that prefetch.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
S=docs/results/fast_s50/scripts/ab_int4.py
timeout 100 python3 $S 3 lib pf512 pf64 pf192 > $OUT/ab_int4.log 2>&1; echo "ab int4 rc=$?"
HEAD=fp8 timeout 90 python3 $S 3 lib pf512 pf256 > $OUT/ab_fp8.log 2>&1; echo "ab fp8 rc=$?"
QUEUED=8 REPS=10 timeout 100 python3 $S 2 lib pf512 > $OUT/ab_queued.log 2>&1; echo "ab queued rc=$?"
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192 --batches 1"
for i in 1 2; do
  timeout 70 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_$i.log 2>&1
  echo "gate $i: $(grep 'batch 1:' $OUT/b7_$i.log | cut -c1-300)"
  timeout 75 python3 examples/bench_fast_7b.py $ARGS --queued 8 > $OUT/b7_q$i.log 2>&1
  echo "gate queued $i: $(grep 'batch 1:' $OUT/b7_q$i.log | cut -c1-300)"
done
timeout 110 python3 -m pytest -q tests/test_int4.py tests/test_fp8.py tests/test_kernels.py -k "gpu or cuda or pdl or prefetch" \
  -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest rc=$?: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"; grep -m8 "^FAILED" $OUT/pytest.log
for f in ab_int4 ab_fp8 ab_queued; do echo "== $f"; grep -A8 "^variant" $OUT/$f.log; grep -m2 -i "error\|Traceback" $OUT/$f.log; done
true
