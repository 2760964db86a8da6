# Session 45, call E: the 7B gate with the head's products on 4-bit weights (force_int4_head.py) against the
# library's float8 head, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
ARGS="--only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for run in lib int4 lib int4; do
  i=$((i+1))
  if [ $run = lib ]; then python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_$i$run.log 2>&1
  else python3 docs/results/fast_s45/scripts/force_int4_head.py $ARGS > $OUT/b7_$i$run.log 2>&1; fi
  echo "$run: $(grep 'batch 1:' $OUT/b7_$i$run.log) $(grep '4-bit head' $OUT/b7_$i$run.log)"
  grep -i -m3 "error\|Traceback" $OUT/b7_$i$run.log
done
