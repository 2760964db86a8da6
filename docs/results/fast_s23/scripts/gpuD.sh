#!/bin/bash
# Session 23, call D: float8 draft heads. GPU tests of the kernels and the head; an EAGLE-1 head trained on the
# fixture (1,500 steps, as sessions 18-21), then bench_fast's fast EAGLE-2 with the head in bf16 and rounded to
# float8 (--fp8-heads): tau and tokens/s, 8 prompts. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
timeout 400 python3 examples/train_eagle.py --target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda \
  --steps 1500 --methods eagle1 --out-dir /tmp/h > $OUT/te.log 2>&1 &
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp8.py > $OUT/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" $OUT/tests.log | tail -8
wait
tail -c 300 $OUT/te.log | tr '\r' '\n' | grep -av "^$" | tail -2; echo "trained at ${SECONDS}s"
for run in 1 2; do
  timeout 200 python3 examples/bench_fast.py --target $F/pycoder-18m --data $F/pycode-heldout.jsonl \
    --eagle2 /tmp/h/eagle1/final --fp8-heads --num-prompts 8 --warmup 2 --max-seconds 20 --batches \
    --only "fast plain" EAGLE-2 --out $OUT/bm$run > $OUT/bm$run.log 2>&1
  echo "bench_fast run $run rc=$? at ${SECONDS}s"; grep -a -A6 "^batch method" $OUT/bm$run.log | head -7
done
(cd $OUT && tar czf bm.tgz bm1 bm2 && rm -r bm1 bm2)
