# Session 50, call A: the 4-bit head's launch settings and prefetch timed inside the 7B EAGLE-2 step (one process,
# alternating rounds; ab_int4.py), then the step's kernels that are not specdec's at this code (session 47's
# chain_breaks.py, with PDL early as landed and with PDL off so that each kernel's duration is its own).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python3 docs/results/fast_s50/scripts/ab_int4.py 3 > $OUT/ab_int4.log 2>&1; echo "ab rc=$?"
INT4=128 FR=8192 SEQ=1 TOP=25 timeout 100 python3 docs/results/fast_s47/scripts/chain_breaks.py > $OUT/breaks.log 2>&1; echo "breaks rc=$?"
SPECDEC_PDL=0 INT4=128 FR=8192 TOP=40 timeout 100 python3 docs/results/fast_s47/scripts/chain_breaks.py > $OUT/breaks_nopdl.log 2>&1; echo "nopdl rc=$?"
grep -A12 "^variant" $OUT/ab_int4.log; grep -i -m3 "error\|Traceback" $OUT/ab_int4.log
grep "^==\|^--" $OUT/breaks.log $OUT/breaks_nopdl.log
true
