#!/bin/bash
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 150 python3 .fixtures/prof_7b.py graphs 2>&1 | grep -v -i warn | tee $OUT/prof_graphs.txt
timeout 300 python3 .fixtures/prof_7b.py compile 2>&1 | grep -v -i warn | tee $OUT/prof_compile.txt
