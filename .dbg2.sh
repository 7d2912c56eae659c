#!/usr/bin/env bash
# Run 5 (4 x H200): the scaling benchmark with this stop's kernels (one attention), and
# local-first with 16 SMs left to NCCL at T = 131072 causal.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=/tmp/b
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_BUILD_TESTS=OFF > $OUT/build.log 2>&1 && timeout 240 cmake --build $B -j48 --target thdcp_cli >> $OUT/build.log 2>&1 || { grep -E "error|FAILED" $OUT/build.log | head -30; exit 1; }
echo "build $SECONDS s"
timeout 420 $B/thdcp bench --scaling --gpus 2,4 --kv kept --tokens 131072,524288 --iters 10 > $OUT/scaling.log 2>&1; echo "scaling rc=$? at $SECONDS s"
grep -E "^\| " $OUT/scaling.log | head -12
timeout 120 $B/thdcp bench --scaling --gpus 2,4 --kv kept --tokens 131072 --mask causal --local-first 1 --sm-margin 16 --iters 10 > $OUT/scaling_lf.log 2>&1; echo "scaling lf rc=$? at $SECONDS s"
grep -E "^\| " $OUT/scaling_lf.log | head -5
grep -E "^verify.*(PASS|FAIL)" $OUT/scaling.log $OUT/scaling_lf.log | grep -c PASS
echo "done at $SECONDS s"
