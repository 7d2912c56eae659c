#!/usr/bin/env bash
# expect_gpu_run.sh GPUS REGEX COMMAND...: runs COMMAND when at least GPUS CUDA devices are
# visible and expects exit 0 with output matching REGEX; exits 77 (ctest: skipped) with the
# reason when fewer are visible.
set -u
need=$1 regex=$2
shift 2
have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${have:-0}" -lt "$need" ]; then
  echo "skipped: needs $need CUDA device(s), $have visible"
  exit 77
fi
out=$("$@" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "expected exit 0, got $rc"; exit 1; }
printf "%s" "$out" | grep -Ezq -- "$regex" || { echo "output does not match: $regex"; exit 1; }
