#!/bin/bash
# Session 42, call F (asks for an H200: its last 7B figure is session 30's, before the linear tuning): the 7B
# batch-1 gate with the tuning timed in the chain (on*) and without tuning (off*), alternating processes.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T=70 bash docs/results/alternate_7b.sh $OUT/b7 on1 off1 on2
