#!/bin/bash
# Session 43, calls B and C in one (little device time left): the 7B gate A/B (gpuB.sh RUN...), then the GPU test
# files call A's cut left (gpuC.sh, T=seconds for the tests).
TESTS_T=${TESTS_T:-270}
T=${T:-65} bash docs/results/fast_s43/scripts/gpuB.sh "$@"
T=$TESTS_T bash docs/results/fast_s43/scripts/gpuC.sh
