#!/usr/bin/env bash
# json_seed.sh THDCP WORKDIR: the largest seed, 2^64-1, is written to the JSON as itself (it
# was written as -1).
set -u
rm -rf "$2" && mkdir -p "$2" || exit 1
"$1" run --backend cpu --tokens 64 --cp 1 --heads 1:1 --head-dim 8 --seed 18446744073709551615 \
     --json "$2/run.json" > /dev/null || exit 1
grep -q '"seed": 18446744073709551615' "$2/run.json" || { echo "seed not written exactly:"; grep seed "$2/run.json"; exit 1; }
echo "seed 18446744073709551615 written exactly"
