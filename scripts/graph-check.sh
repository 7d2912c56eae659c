#!/usr/bin/env bash
# The GPU run of the graph work in one command: build, the graph/RoPE/CP GPU tests, then
# `thdcp run --graph` (fixed and dynamic CP) and `thdcp bench --graph`. Logs in OUTDIR.
#   usage: scripts/graph-check.sh OUTDIR [quick|bench|graph]
#   (quick: no bench; bench: no full suite; graph: build, test_graph and its memcheck only)
set -u -o pipefail
OUTDIR=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${THDCP_GPU_BUILD_DIR:-$ROOT/build-gpu-check}
mkdir -p "$OUTDIR"
status=0
step() {
  local name=$1 log=$OUTDIR/$2
  shift 2
  local start=$SECONDS
  echo "== $name: $*" >> "$log"
  if "$@" >> "$log" 2>&1; then echo "ok      $name ($((SECONDS - start)) s)"; else
    echo "FAILED  $name (exit $?, $((SECONDS - start)) s; see $(basename "$log"))"; tail -n 30 "$log"; status=1; fi
}
echo "graph-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
step configure build.log cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_WITH_CUDA=ON
step build build.log cmake --build "$BUILD" -- -k 0
if [ "${2:-}" = graph ]; then  # the graph tests and their memcheck only
  step "test_graph" tests.log "$BUILD/tests/test_graph"
  step "compute-sanitizer memcheck (graph)" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$BUILD/tests/test_graph" --gtest_filter='Cp/GraphBankTest.*cp2:GraphBankFallback.*'
  grep -hE "PASSED|FAILED|ERROR SUMMARY" "$OUTDIR"/*.log
  exit $status
fi
[ "${2:-}" = "" ] || step "ctest graph, rope, cp, nccl, capture" tests.log ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300 -j 2 \
  -R "Graph|Rope|ROPE|rope|CudaCp|Nccl|nccl|Capture|Capacity"
step "thdcp run --graph" run.log "$BUILD/thdcp" run --graph --steps 12
step "thdcp run --graph --dynamic-cp 1,2,4" run.log "$BUILD/thdcp" run --graph --dynamic-cp 1,2,4 --steps 12 --check-every 1
step "thdcp run --graph --max-seqs 48 (fallbacks)" run.log "$BUILD/thdcp" run --graph --cp 2 --max-seqs 48 --steps 10 --median 200
if [ "${2:-}" != quick ]; then
  step "thdcp bench --graph" bench.log "$BUILD/thdcp" bench --graph
fi
if [ "${2:-}" = "" ]; then
  step "ctest -L gpu (all)" tests-all.log ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300 -j 2
  step "ctest -L multi_gpu" tests-all.log ctest --test-dir "$BUILD" -L multi_gpu --output-on-failure --timeout 300
  step "compute-sanitizer memcheck (graph)" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$BUILD/tests/test_graph" --gtest_filter='Cp/GraphBankTest.*cp2:GraphBankFallback.*'
fi
grep -hE "tests passed|result:" "$OUTDIR"/*.log
exit $status
