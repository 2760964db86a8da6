# Session 44, prepared and NOT run (no device time was left): the head's row kernels by warps (row_warps.py), then the 7B gate with the best warps against the
# library's, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
python3 docs/results/fast_s44/scripts/row_warps.py $OUT/row_warps.json 2>&1 | grep -v -i warn
W=$(python3 -c "
import json
r = json.load(open('$OUT/row_warps.json'))
out = []
for name, lib in (('silu_mul', 8), ('embed_concat', 8), ('quant_rows', 4), ('add_rms_norm', 8)):
    row = next(v for k, v in r.items() if k.startswith(name))
    t = {int(k): v for k, v in row.items() if isinstance(v, float)}
    best = min(t, key=t.get)
    out.append(str(best if t[best] < 0.95 * t[lib] else 0))
print(','.join(out))")
echo "row warps picked: $W"
[ "$W" = "0,0,0,0" ] && exit 0
ARGS="--only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for run in lib best lib best; do
  i=$((i+1))
  if [ $run = lib ]; then python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_$i$run.log 2>&1
  else ROW_WARPS=$W python3 docs/results/fast_s44/scripts/force_row_warps.py $ARGS > $OUT/b7_$i$run.log 2>&1; fi
  echo "$run: $(grep 'batch 1:' $OUT/b7_$i$run.log)"
done
