# Session 50, call B: tree attention's plans (verify and head level), prefetch and the in-launch split sum timed
# inside the 7B EAGLE-2 step with the 4-bit head, one process, alternating rounds (ab_int4.py).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 560 python3 docs/results/fast_s50/scripts/ab_int4.py 3 lib fmerge pf256 pf128 pf384 vpf256 fixup h64w4s2 h64w4s1 h128w4s1 hsplit2x hsplit.5 v4split v3split v1split vm16 vm64 vm64s4 v6split v4s32w4 vt32 vt128 vs2 vw4 u2 u2st2 bn128w8 > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep "replaced" $OUT/ab.log | tail -1
grep -A30 "^variant" $OUT/ab.log; grep -i -m3 "error\|Traceback" $OUT/ab.log
true
# then the gate as bench_fast_7b.py times it, two processes (the card's own figures)
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --reps 20 --warmup 3 --draft-vocab 8192 --batches 1"
for i in 1 2; do
  timeout 70 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_$i.log 2>&1
  echo "gate $i: $(grep 'batch 1:' $OUT/b7_$i.log | cut -c1-300)"
done
true
