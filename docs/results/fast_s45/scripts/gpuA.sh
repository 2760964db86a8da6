# Session 45, call A: the 4-bit head product prototype (int4_head.py) against the float8 product, then session 44's
# prepared row-kernel sweep (gpuF.sh: warps of the head's one-program-per-row kernels; the 7B gate A/B if one wins).
export PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 260 python3 docs/results/fast_s45/scripts/int4_head.py $OUT/int4_head.json --rows 10 --deadline 230 2>&1 | grep -v -i warn
timeout 300 bash docs/results/fast_s44/scripts/gpuF.sh 2>&1 | grep -v -i warn
