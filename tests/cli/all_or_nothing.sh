#!/usr/bin/env bash
# all_or_nothing.sh THDCP WORKDIR: a run whose last output cannot be written (the file-size
# limit lets the .npy files of --save through but not the larger --json) exits 2 and leaves
# nothing: no --save directory, no JSON, no temporaries (issue 10, class 4).
set -u
thdcp=$1
work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
# Past the limit a write fails with EFBIG instead of the process being killed by SIGXFSZ.
trap '' XFSZ
out=$(prlimit --fsize=1500 "$thdcp" run --tokens 64 --cp 4 --heads 1:1 --head-dim 8 --backend cpu \
      --save saved --json run.json 2>&1)
status=$?
printf '%s\n' "$out" | tail -n 2
if [ "$status" -ne 2 ]; then echo "expected exit code 2, got $status"; exit 1; fi
if ! printf '%s' "$out" | grep -q "run.json': writing failed"; then echo "no message about run.json"; exit 1; fi
left=$(ls -A)
if [ -n "$left" ]; then echo "left behind: $left"; exit 1; fi
# Without the limit the same run writes both.
"$thdcp" run --tokens 64 --cp 4 --heads 1:1 --head-dim 8 --backend cpu --save saved --json run.json > /dev/null || exit 1
[ -f run.json ] && [ "$(ls saved | wc -l)" -eq 12 ] || { echo "the unlimited run did not write its outputs"; exit 1; }
echo "all or nothing: ok"
