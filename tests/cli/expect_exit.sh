#!/usr/bin/env bash
# expect_exit.sh CODE REGEX COMMAND...: runs COMMAND, fails unless it exits with CODE and
# its output (stdout and stderr) matches the extended regex REGEX.
set -u
code="$1"; regex="$2"; shift 2
output=$("$@" 2>&1)
status=$?
if [ "$status" -ne "$code" ]; then
  printf 'expected exit code %s, got %s from: %s\n%s\n' "$code" "$status" "$*" "$output"
  exit 1
fi
if ! printf '%s' "$output" | grep -Ezq -- "$regex"; then
  printf 'output of %s does not match /%s/:\n%s\n' "$*" "$regex" "$output"
  exit 1
fi
printf '%s\n' "$output" | tail -n 3
