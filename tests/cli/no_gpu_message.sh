#!/usr/bin/env bash
# no_gpu_message.sh THDCP: `thdcp run --tokens 256` where no GPU can be used says so once,
# in its summary ("CPU backend (no GPU found)"), passes on the CPU backend, and prints no raw
# CUDA error text (a machine without a driver made CUDA say "CUDA driver version is
# insufficient for CUDA runtime version"; issue 29). Run as it is (on a machine with a GPU
# that run is on the CUDA backend, also without CUDA error text) and with
# CUDA_VISIBLE_DEVICES="" hiding every GPU.
set -u
thdcp="$1"
failed=0
check() {
  local what="$1"; shift
  local output status
  output=$("$@" "$thdcp" run --tokens 256 --quiet 2>&1)
  status=$?
  printf '%s: %s\n' "$what" "$(printf '%s\n' "$output" | head -n 1)"
  if [ "$status" -ne 0 ]; then
    printf '  FAIL: exit %s\n%s\n' "$status" "$output"; failed=1
  fi
  if printf '%s' "$output" | grep -Eiq 'insufficient|driver version|cudaError|CUDA error'; then
    printf '  FAIL: raw CUDA error text:\n%s\n' "$output"; failed=1
  fi
  if ! printf '%s' "$output" | head -n 1 | grep -Eq 'CUDA backend \(|CPU backend \(no GPU found'; then
    printf '  FAIL: the summary names neither a GPU nor "CPU backend (no GPU found)"\n'; failed=1
  fi
  if printf '%s' "$output" | head -n 1 | grep -q 'CPU backend' && [ "$(printf '%s' "$output" | grep -c 'no GPU found')" -ne 1 ]; then
    printf '  FAIL: "no GPU found" is not said exactly once:\n%s\n' "$output"; failed=1
  fi
}
check "as it is" env
check 'CUDA_VISIBLE_DEVICES=""' env CUDA_VISIBLE_DEVICES=
if [ "$failed" -ne 0 ]; then exit 1; fi
echo PASS
