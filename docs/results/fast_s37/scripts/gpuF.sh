#!/bin/bash
# Session 37, call F: session 30's call D at session 37's fixed code (the fixture beside gpt-fast in one process, every
# specdec method, the six heads trained first in the same call). Carry .fixtures/fx.
exec bash docs/results/fast_s30/scripts/gpuD.sh
