# Session 47, call B: the kernels that end the early-scheduled chain (chain_breaks.py, 4-bit head, early on); then
# the 7B gate: library / early / early + the head's products prefetching 512 or all bytes of their weight rows into
# L2 before their wait, alternating processes.
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
SPECDEC_PDL_EARLY=1 INT4=128 FR=8192 timeout 80 python3 docs/results/fast_s47/scripts/chain_breaks.py > $OUT/breaks.log 2>&1
head -60 $OUT/breaks.log | cut -c1-160
ARGS="--only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 --warmup 3 --draft-vocab 8192"
i=0
for cfg in "0 0" "1 0" "1 512" "1 8192" "1 0" "1 512" "1 8192"; do
  set -- $cfg
  i=$((i+1))
  SPECDEC_PDL_EARLY=$1 SPECDEC_PREFETCH=$2 timeout 70 python3 examples/bench_fast_7b.py $ARGS > $OUT/b7_${i}_e$1_p$2.log 2>&1
  echo "early=$1 prefetch=$2: $(grep 'batch 1:' $OUT/b7_${i}_e$1_p$2.log | cut -c1-300)"
  grep -i -m3 "error\|Traceback" $OUT/b7_${i}_e$1_p$2.log
done
true
