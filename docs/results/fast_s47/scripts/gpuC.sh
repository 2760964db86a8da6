# Session 47, call C: the 7B gate with the early schedule and L2 prefetches before the wait: the head's products
# (SPECDEC_PREFETCH) and the verify's skinny products (SPECDEC_PREFETCH_VERIFY), bytes per weight row, alternating
# processes; then the fast path's GPU tests under the early schedule with both prefetches.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for cfg in "1 0 0" "1 512 0" "1 512 512" "1 512 2048" "1 0 0" "1 512 0" "1 512 512" "1 512 2048"; do
  set -- $cfg
  i=$((i+1))
  SPECDEC_PDL_EARLY=$1 SPECDEC_PREFETCH=$2 SPECDEC_PREFETCH_VERIFY=$3 timeout 70 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_e$1_p$2_v$3.log 2>&1
  echo "early=$1 head=$2 verify=$3: $(grep 'batch 1:' $OUT/b7_${i}_e$1_p$2_v$3.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_e$1_p$2_v$3.log
done
SPECDEC_PDL_EARLY=1 SPECDEC_PREFETCH=512 SPECDEC_PREFETCH_VERIFY=512 timeout 170 python3 -m pytest -q -x tests/test_fast_path.py tests/test_skinny.py tests/test_int4.py tests/test_fp8.py -k "gpu or cuda or fast" > $OUT/pytest_early.log 2>&1
echo "pytest early+prefetch: $(tail -1 $OUT/pytest_early.log)"; grep -m5 "FAILED\|Error" $OUT/pytest_early.log
true
