# Session 50, call D (run as one command line on the warm machine after call C): the gate as bench_fast_7b.py times
# it, each step from an idle device, eight more processes at the new default (the heads prefetching 128 bytes a row).
export PYTHONPATH=.; ARGS="--only fast_plain fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192 --batches 1"; for i in 1 2 3 4 5 6 7 8; do timeout 60 python3 examples/bench_fast_7b.py $ARGS > $OUT/g_$i.log 2>&1; echo "gate $i: $(grep 'batch 1:' $OUT/g_$i.log | cut -c1-200)"; done
