#!/bin/bash
# Session 42, call B (one GPU, no fixture, ~5 min). 1. The capture fix: tests/test_gpu.py's new collection test with
# the fix and, in a copy of the tree, without it (must fail there). 2. Where the 7B step idles (gaps.py): the plain
# step, the EAGLE-2 float8 FR-Spec step as tuned, and the same with the tuning kept to the skinny kernel. 3. The
# head-variant CUDA fuzz again (call A's had 3 capture errors, the cause fixed here).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $OUT/tests_gpu.log 2>&1
echo "test_gpu.py rc=$? at ${SECONDS}s: $(tail -1 $OUT/tests_gpu.log)"
rm -rf /tmp/nofix && cp -r . /tmp/nofix && sed -i 's/with no_gc(), torch.cuda.graph(graph):/with torch.cuda.graph(graph):/' \
  /tmp/nofix/specdec/graphs.py && (cd /tmp/nofix && PYTHONPATH=/tmp/nofix timeout 60 python3 -m pytest -q \
  -p no:cacheprovider tests/test_gpu.py -k collection > $OUT/tests_nofix.log 2>&1; echo "without the fix rc=$?: \
$(tail -1 $OUT/tests_nofix.log)")
PLAIN=1 TOP=12 timeout 80 python3 docs/results/fast_s42/scripts/gaps.py > $OUT/gaps_plain.txt 2>&1
echo "gaps plain rc=$? at ${SECONDS}s"
FP8=1 FR=8192 timeout 90 python3 docs/results/fast_s42/scripts/gaps.py > $OUT/gaps_eagle2.txt 2>&1
echo "gaps eagle2 rc=$? at ${SECONDS}s"
SKINNY_ONLY=1 FP8=1 FR=8192 timeout 90 python3 docs/results/fast_s42/scripts/gaps.py > $OUT/gaps_eagle2_skinny.txt 2>&1
echo "gaps eagle2 skinny-only rc=$? at ${SECONDS}s"
FUZZ_DEVICE=cuda FUZZ_HEADS=1 FUZZ_METHODS=eagle1,eagle2,eagle3,dflash,dspark FUZZ_SECONDS=90 timeout 140 \
  python3 docs/results/fast_s34/scripts/fuzz_paths.py 110000 2000 > $OUT/fuzz_heads_cuda.log 2>&1
echo "fuzz rc=$? at ${SECONDS}s: $(tail -1 $OUT/fuzz_heads_cuda.log)"
grep -h "^==\|us/step" $OUT/gaps_*.txt | cut -c1-140
