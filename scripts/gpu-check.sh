#!/usr/bin/env bash
# One GPU run in one command: configure + build (Release, Ninja, own build dir), the GPU
# tests (ctest -L gpu) and the full suite, compute-sanitizer memcheck on small GPU cases,
# `thdcp bench` and the PyTorch peers on the same batch. Logs go to OUTDIR (8 files, so
# they fit what a lent device machine sends back); the summary is printed last.
#   usage: scripts/gpu-check.sh OUTDIR
set -u -o pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${THDCP_GPU_BUILD_DIR:-$ROOT/build-gpu-check}
mkdir -p "$OUTDIR"
SUMMARY=$OUTDIR/summary.txt
: > "$SUMMARY"
status=0

say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LOG COMMAND...: runs COMMAND, appending its output to OUTDIR/LOG.
step() {
  local name=$1 log=$OUTDIR/$2
  shift 2
  echo "== $name: $*" >> "$log"
  local start=$SECONDS
  if "$@" >> "$log" 2>&1; then
    say "ok      $name ($((SECONDS - start)) s)"
  else
    local rc=$?
    say "FAILED  $name (exit $rc, $((SECONDS - start)) s; see $(basename "$log"))"
    tail -n 40 "$log"
    status=1
  fi
}

say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
step configure build.log cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_WITH_CUDA=ON
# -k 0: a target that fails to build does not stop the others (the log names it).
step build build.log cmake --build "$BUILD" -- -k 0
step "ctest -L gpu" ctest-gpu.log ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 120 -j 2
step "ctest -L multi_gpu" ctest-gpu.log ctest --test-dir "$BUILD" -L multi_gpu --output-on-failure --timeout 120
step "ctest (all)" ctest-all.log ctest --test-dir "$BUILD" --output-on-failure -j 4 --timeout 180 -LE "gpu|multi_gpu"
# Both kernel families (on Hopper the sm90 ones unless THDCP_PORTABLE_KERNELS=1).
MEMCHECK_CASES='EdgeCases/CudaAttentionEdge.MatchesCpuReference/empty_and_len1_causal_bf16_d64:EdgeCases/CudaAttentionEdge.MatchesCpuReference/cp2_rank0_causal_bf16_d64:EdgeCases/CudaAttentionEdge.MatchesCpuReference/padding_multi_key_tiles_full_fp16_d128:CudaGraph.*'
step memcheck memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$BUILD/tests/cuda/test_cuda_attention" --gtest_filter="$MEMCHECK_CASES"
step "memcheck (portable kernels)" memcheck.log env THDCP_PORTABLE_KERNELS=1 \
  compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$BUILD/tests/cuda/test_cuda_attention" --gtest_filter="$MEMCHECK_CASES"
# The main job on its default workload: CUDA backend, cp = 4 ranks on this GPU, checked
# against the CPU reference.
step "thdcp run" run.log "$BUILD/thdcp" run --quiet
step "mpirun -np 1 thdcp run (NCCL)" run.log env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np 1 "$BUILD/thdcp" run --quiet --tokens 8192
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$GPUS" -ge 2 ]; then
  step "thdcp run --gpus $GPUS (NCCL)" run.log "$BUILD/thdcp" run --quiet --gpus "$GPUS"
  step "mpirun -np $GPUS thdcp run (NCCL)" run.log env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np "$GPUS" --oversubscribe "$BUILD/thdcp" run --quiet
fi
step "memcheck (CP, shared GPU)" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$BUILD/tests/test_cuda_cp" --gtest_filter='EdgeCases/CudaCpSharedGpu.*/cp2_short_and_empty*:EdgeCases/CudaCpSharedGpu.*/cp3_window_wider*:CudaCpFaults.DisagreeingPlansAreRefusedOnEveryRank'
LENGTHS=$BUILD/bench_lengths.txt
step bench bench.log "$BUILD/thdcp" bench --lengths-out "$LENGTHS" --cp 2,4,8
if [ -s "$LENGTHS" ]; then
  # cuDNN's fused attention is the third peer: the nvidia-cudnn-frontend wheel travels with the
  # tree in .whl/ (git-ignored; no network here) and goes to /tmp/site. Without the wheel, or
  # when it does not install, the peer reports itself not available: the check goes on.
  PEERS_PYTHONPATH=${PYTHONPATH:-}
  CUDNN_WHEELS=("$ROOT"/.whl/nvidia_cudnn_frontend-*.whl)
  if [ -f "${CUDNN_WHEELS[0]}" ]; then
    echo "== cudnn frontend: pip install --target /tmp/site $ROOT/.whl/*.whl" >> "$OUTDIR/peers.log"
    if PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl >> "$OUTDIR/peers.log" 2>&1; then
      say "ok      cudnn frontend wheel installed to /tmp/site"
      PEERS_PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
      say "skipped cudnn frontend wheel (pip install failed; see peers.log)"
    fi
  else
    say "skipped cudnn frontend wheel (no .whl/nvidia_cudnn_frontend-*.whl: the cuDNN peer is not available)"
  fi
  # FlashAttention-4 is the fourth: its wheels, packed by ../shared/tools/fa4_wheels.py into
  # .whl-fa4/ (with the script), are joined and installed to /tmp/site the same way; its CuTe
  # DSL also needs dsl_packages on the path. Without them the peer reports itself missing.
  if [ -f "$ROOT/.whl-fa4/fa4_wheels.py" ]; then
    echo "== flash-attn-4: join and pip install --target /tmp/site $ROOT/.whl-fa4/*.whl" >> "$OUTDIR/peers.log"
    if (cd "$ROOT" && python3 .whl-fa4/fa4_wheels.py join) >> "$OUTDIR/peers.log" 2>&1 &&
        PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile \
          --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl-fa4/*.whl >> "$OUTDIR/peers.log" 2>&1; then
      say "ok      flash-attn-4 wheels installed to /tmp/site"
      PEERS_PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PEERS_PYTHONPATH:+:$PEERS_PYTHONPATH}
    else
      say "skipped flash-attn-4 wheels (join or pip install failed; see peers.log)"
    fi
  else
    say "skipped flash-attn-4 wheels (no .whl-fa4/: the FA4 peer is not available)"
  fi
  step peers peers.log env PYTHONUNBUFFERED=1 PYTHONPATH="$PEERS_PYTHONPATH" \
    python3 "$ROOT/bench/peer_attention.py" --lengths "$LENGTHS" --cudnn-det --floor
else
  say "skipped peers (the bench wrote no lengths)"
fi

{
  echo
  echo "--- ctest -L gpu"
  grep -E "tests passed|tests failed|Total Test time|\*\*\*Skipped|\*\*\*Failed|Failed  " "$OUTDIR/ctest-gpu.log"
  echo "--- ctest -L multi_gpu"
  grep -E "tests passed|tests failed|\*\*\*Failed" "$OUTDIR/ctest-gpu.log" | tail -n 4
  echo "--- ctest (all)"
  grep -E "tests passed|tests failed|Total Test time|\*\*\*Failed" "$OUTDIR/ctest-all.log"
  echo "--- memcheck"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUTDIR/memcheck.log" | tail -n 8
  echo "--- thdcp run"
  grep -E "^thdcp run:|result:|^  (out|lse|max_logit|dq|dk|dv) |^== " "$OUTDIR/run.log"
  echo "--- bench"
  grep -vE "^== " "$OUTDIR/bench.log" | grep -vE "^verify" | tail -n 30
  grep -E "^verify" "$OUTDIR/bench.log" | awk '{print $1, $2, $3, $4, $5, $6, $7}' | head -n 40
  echo "--- peers"
  # Indented lines are the detail of a failure (cuDNN lists every engine's reason).
  grep -vE "^== |^ " "$OUTDIR/peers.log" 2>/dev/null | tail -n 40
} | tee -a "$SUMMARY"
exit $status
