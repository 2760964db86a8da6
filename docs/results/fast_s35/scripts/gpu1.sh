#!/bin/bash
# Session 35, call 1 (prepared; no device could be started in session 35): the GPU tests at this code (sessions 32-34's changes: the in-graph verify mask, in-place
# drafter inputs, per-row draft cuts when sampling), the 7B step's opt-ins in one process (ab_7b.py, batch 1), then
# the differential fuzz on CUDA for the time left. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_fast_path.py \
  tests/test_eagle_drafter.py tests/test_parallel_graphs.py tests/test_medusa_drafter.py tests/test_prompt_lookup.py \
  tests/test_graphs.py tests/test_gpu.py tests/test_tree_attention.py tests/test_inputs.py -k "not compiled" \
  > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -a "^FAILED\|^ERROR" $OUT/tests.log | head -20 | cut -c1-250; tail -1 $OUT/tests.log
t=$((560 - SECONDS)); t=$((t > 230 ? 230 : t))
timeout $t python3 docs/results/fast_s35/scripts/ab_7b.py --batches 1 --rounds 6 --reps 10 --variants fm0_fold0 fm1_fold0 fm0_fold1 direct_fold0 --out $OUT/ab_7b_b1.json \
  > $OUT/ab_7b_b1.log 2>&1
echo "ab_7b b1 rc=$? at ${SECONDS}s"
left=$((565 - SECONDS))
if [ $left -gt 60 ]; then
  FUZZ_DEVICE=cuda FUZZ_SECONDS=$((left - 30)) timeout $left python3 docs/results/fast_s34/scripts/fuzz_paths.py 80000 \
    2000 > $OUT/fuzz_cuda.log 2>&1
  echo "fuzz rc=$? at ${SECONDS}s"; grep -v "^ \|eos_token_id must" $OUT/fuzz_cuda.log | cut -c1-250 | tail -6
fi
grep -a "round\|^|" $OUT/ab_7b_b1.log | cut -c1-250
