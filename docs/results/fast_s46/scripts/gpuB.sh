# Session 46, call B: the 4-bit product's launches swept per group size (int4_sweep.py), then the 7B gate with the
# sweep's picks (force_int4_cfg.py) at 64 and 128 inputs per scale, alternating with the library's defaults.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 docs/results/fast_s46/scripts/int4_sweep.py $OUT/int4_sweep.json --deadline 250 > $OUT/sweep.log 2>&1
grep -v Warning $OUT/sweep.log | tail -20
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for run in pick64 lib64 pick128 pick64; do
  i=$((i+1)); g=${run: -2}; [ $g = 28 ] && g=128
  if [ ${run:0:4} = pick ]; then
    timeout 70 python3 docs/results/fast_s46/scripts/force_int4_cfg.py $OUT/int4_sweep.json $ARGS --int4-group $g > $OUT/b7_${i}_$run.log 2>&1
  else
    timeout 70 python3 examples/bench_fast_7b.py $ARGS --int4-group $g > $OUT/b7_${i}_$run.log 2>&1
  fi
  echo "$run: $(grep 'batch 1:' $OUT/b7_${i}_$run.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_$run.log
done
