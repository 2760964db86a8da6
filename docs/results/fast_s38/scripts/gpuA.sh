#!/bin/bash
# Session 38, call A: session 37's call G again with the harness that times with the collector off and counts,
# per timed call, captures, rebuilds and Triton kernels loaded or compiled (to find session 37's one 0.74 s prompt
# lookup call); first the GPU tests session 37's calls did not reach. Carry .fixtures/fx. (The run used an inline copy of
# gpuG.sh without its -k filter, which deselects none of these tests.)
TAIL_S=120 TAIL_TESTS="tests/test_inputs.py tests/test_fast_path.py::test_held_graphs_reports_the_stores_generate_keeps" \
  exec bash docs/results/fast_s37/scripts/gpuG.sh
