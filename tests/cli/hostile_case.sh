#!/usr/bin/env bash
# hostile_case.sh CODE REGEX AS_BYTES SECONDS COMMAND...: one hostile-input case of issue 28.
# Runs COMMAND, each argument's "<ESC>" and "<BEL>" replaced by those bytes (CMake cannot
# write them), and fails unless
#   - it exits with CODE (never 3, an internal error) within SECONDS,
#   - its output (stdout and stderr) matches the extended regex REGEX,
#   - its output holds no raw control byte but newlines (values are quoted escaped).
# AS_BYTES: a number > 0 runs it under prlimit --as=AS_BYTES, so its address space (and with
# it its memory) stays bounded; 0 runs it without (under AddressSanitizer, whose shadow
# memory no such limit admits); "skip" exits 77 (a case that means nothing without it).
set -u
code=$1; regex=$2; as_bytes=$3; seconds=$4; shift 4
if [ "$as_bytes" = skip ]; then
  echo "skipped: needs an address-space limit (not under AddressSanitizer)"
  exit 77
fi
esc=$(printf '\033'); bel=$(printf '\007')
args=()
for a in "$@"; do
  a=${a//<ESC>/$esc}
  args+=("${a//<BEL>/$bel}")
done
if [ "$as_bytes" != 0 ]; then args=(prlimit --as="$as_bytes" "${args[@]}"); fi
start=$EPOCHREALTIME
output=$("${args[@]}" 2>&1)
status=$?
elapsed=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
shown=$(printf '%s' "$output" | cat -v | tail -c 3000)
fail() {
  printf 'FAIL: %s\ncommand: %s\noutput (control bytes shown by cat -v):\n%s\n' "$1" "$(printf '%s ' "${args[@]}" | cat -v)" "$shown"
  exit 1
}
[ "$status" -eq "$code" ] || fail "expected exit code $code, got $status"
printf '%s' "$output" | grep -Ezq -- "$regex" || fail "output does not match /$regex/"
if printf '%s' "$output" | tr -d '\n' | LC_ALL=C grep -q '[[:cntrl:]]'; then fail "raw control bytes in the output"; fi
awk -v e="$elapsed" -v s="$seconds" 'BEGIN { exit !(e <= s) }' || fail "took ${elapsed} s, more than ${seconds} s"
printf '%s\n' "$shown" | tail -n 2
limit=""; [ "$as_bytes" != 0 ] && limit=", address space at most $as_bytes bytes"
echo "exit $status in ${elapsed} s$limit"
