# Session 50, call E (one command line, the same warm machine): the gate with 8 steps queued back to back per timed
# run (as the anchor times gpt-fast's step and as generate() runs), three more processes.
export PYTHONPATH=.; ARGS="--only fast_plain fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192 --batches 1 --queued 8"; for i in 1 2 3; do timeout 60 python3 examples/bench_fast_7b.py $ARGS > $OUT/q_$i.log 2>&1; echo "queued $i: $(grep 'batch 1:' $OUT/q_$i.log | cut -c1-200)"; done
