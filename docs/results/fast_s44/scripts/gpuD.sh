# Session 44 call D (run with SHORT=1: one process each way): tree attention with many key chunks (attn_splits.py), then the 7B gate with the sweep's best
# verify launch against the plan, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 docs/results/fast_s44/scripts/attn_splits.py $OUT/attn_splits.json > $OUT/attn_splits.log 2>&1
grep -v "^  fail" $OUT/attn_splits.log | grep -v -i warn | head -42
PLAN=$(python3 -c "
import json
r = json.load(open('$OUT/attn_splits.json'))['verify, batch 1: 61 nodes, 573 live of 1216']
best = [x for x in r if x['note'] == 'sweep' and x['err'] < 0.02][0]['cfg']
print(','.join(str(int(v)) for v in best))")
echo "best verify plan: $PLAN"
ARGS="--only fast_plain fast_spec_fr8 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for run in plan best plan best; do
  [ $i -ge 2 ] && [ "$SHORT" = 1 ] && break
  i=$((i+1))
  if [ $run = plan ]; then python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_$i$run.log 2>&1
  else TREE_PLAN=$PLAN python3 docs/results/fast_s44/scripts/force_tree_plan.py $ARGS > $OUT/b7_$i$run.log 2>&1; fi
  echo "$run: $(grep 'batch 1:' $OUT/b7_$i$run.log)"
done
