#!/bin/bash
# Session 21, call A: the five heads trained as in session 19's gpuO.sh (same budgets, all at once), kept in
# .fixtures/heads for call B and brought back as heads.tgz; then cuBLAS against cuBLASLt on the 7B linear shapes
# (bench_blas.py) and one 7B step (fast plain, EAGLE-2 FR-Spec 8192; batch 1) under each library. Carry .fixtures/fx.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
F=.fixtures/fx; H=.fixtures/heads; rm -rf $H; mkdir -p $H $OUT/t
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
COMMON="--target $F/pycoder-18m --data-dir $SP --max-files 4000 --device cuda"
timeout 240 python3 examples/train_peagle.py $COMMON --steps 100000 --time-budget 160 --batch-size 32 --seq-len 512 \
  --max-drafts 8 --num-layers 2 --out-dir $H/p > $OUT/t/tp.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dspark $COMMON --steps 100000 --time-budget 130 \
  --batch-size 32 --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/s > $OUT/t/ts.log 2>&1 &
timeout 240 python3 examples/train_dflash.py --method dflash $COMMON --steps 100000 --time-budget 90 --batch-size 32 \
  --seq-len 512 --block-size 8 --num-layers 2 --out-dir $H/d > $OUT/t/td.log 2>&1 &
timeout 240 python3 examples/train_medusa.py --method medusa1 $COMMON --steps 100000 --time-budget 90 \
  --calib-prompts 8 --out-dir $H/m > $OUT/t/tm.log 2>&1 &
timeout 240 python3 examples/train_eagle.py $COMMON --steps 1500 --methods eagle1 --out-dir $H/h > $OUT/t/te.log 2>&1 &
wait
for f in tp ts td tm te; do echo "== $f"; tail -c 400 $OUT/t/$f.log | tr '\r' '\n' | grep -av "^$" | tail -2; done
pkill -f examples/train_ ; sleep 1; echo "trained at ${SECONDS}s"
tar czf $OUT/heads.tgz $H/p/peagle/final $H/d/dflash/final $H/s/dspark/final $H/m/medusa $H/h/eagle1/final
ls -la $OUT/heads.tgz; (cd $OUT && tar czf t.tgz t && rm -r t)
timeout 150 python3 docs/results/fast_s21/scripts/bench_blas.py > $OUT/blas.log 2>&1
echo "blas rc=$? at ${SECONDS}s"
for lib in cublas cublaslt; do
  timeout 120 python3 -c "import runpy, sys, torch; torch.backends.cuda.preferred_blas_library('$lib'); \
sys.argv = ['bench_fast_7b.py', '--only', 'fast_plain', 'fast_spec_fr', '--batches', '1', '--reps', '10', \
'--warmup', '3', '--draft-vocab', '8192', '--out', '$OUT/b7_$lib']; \
runpy.run_path('examples/bench_fast_7b.py', run_name='__main__')" > $OUT/b7_$lib.log 2>&1
  echo "7b $lib rc=$? at ${SECONDS}s"; grep "^| [0-9]" $OUT/b7_$lib.log
done
(cd $OUT && tar czf b7.tgz b7_cublas b7_cublaslt && rm -r b7_cublas b7_cublaslt)
grep "^M=\|^one" $OUT/blas.log
