#!/usr/bin/env bash
# Run 2 (4 x H200), part 2: the scaling benchmark, local-first against one attention.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=$PWD/build-dev
[ -x $B/thdcp ] || { echo "no build"; exit 1; }
timeout 560 $B/thdcp bench --scaling --gpus 2,4 --kv kept --local-first 1,0 --tokens ${TOKENS:-131072,524288} --iters ${ITERS:-10} > $OUT/scaling.log 2>&1; echo "scaling rc=$?"
grep -E "^(baseline|result|collectives)" $OUT/scaling.log
grep -E "^\| " $OUT/scaling.log | head -30
echo "done at $SECONDS s"
