#!/bin/bash
# Session 48, call C (the budget's last): EAGLE-1 and EAGLE-3 heads trained on the fixture in the background (cut by
# time: the trainer saves its final head on SIGTERM) while the GPU tests call B's time limit did not reach run
# (test_gpu.py, the EAGLE drafter's); then one more 7B gate process at this code; then the fixture beside gpt-fast in
# one process (plain, SpS K=4, prompt lookup, EAGLE-2, EAGLE-3; 5 prompts). Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/t
nvidia-smi --query-gpu=name --format=csv,noheader
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 150 python3 examples/train_eagle.py $COMMON --steps 1200 --methods eagle1 --out-dir $H/h > $OUT/t/te.log 2>&1 &
timeout 160 python3 examples/train_eagle.py $COMMON --steps 700 --methods eagle3 --out-dir $H/h3 > $OUT/t/t3.log 2>&1 &
timeout 140 python3 -m pytest -q -x tests/test_gpu.py tests/test_eagle_drafter.py tests/test_eagle_vocab.py \
  -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "pytest rc=$? at ${SECONDS}s: $(grep -E 'passed|failed' $OUT/pytest.log | tail -1 | cut -c1-200)"
grep -m8 "^FAILED\|^ERROR" $OUT/pytest.log | cut -c1-300
wait
echo "trained at ${SECONDS}s"; ls -d $H/*/*/final
for f in te t3; do tail -c 300 $OUT/t/$f.log | tr '\r' '\n' | grep -a "train_seconds" | cut -c1-200; done
(cd $OUT && tar czf t.tgz t && rm -r t)
timeout 70 python3 examples/bench_fast_7b.py --only fast_plain fast_spec_fr8 fast_spec_fr4 --batches 1 --reps 20 \
  --warmup 3 --draft-vocab 8192 > $OUT/b7.log 2>&1
echo "7B gate at ${SECONDS}s: $(grep 'batch 1:' $OUT/b7.log | cut -c1-300)"
timeout $((555 - SECONDS)) python3 examples/bench_fast.py --target $F/pycoder-18m --draft $F/pycoder-draft-4m \
  --data $F/pycode-heldout.jsonl --gptfast $F/anchors --eagle2 $H/h/eagle1/final --eagle3 $H/h3/eagle3/final \
  --num-prompts 5 --warmup 1 --max-seconds 6 --batches --draft-k 4 \
  --only "fast plain" "SpS K=4" "prompt lookup" EAGLE-2 EAGLE-3 --skip "level by level" "eager draft" \
  --out $OUT/bm > $OUT/bm.log 2>&1
echo "bench_fast rc=$? at ${SECONDS}s"; (cd $OUT && tar czf bm.tgz bm && rm -r bm)
grep -a -A12 "^batch method" $OUT/bm.log | head -13; grep -a "^- " $OUT/bm.log | tail -5
true
