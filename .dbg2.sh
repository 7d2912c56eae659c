#!/usr/bin/env bash
# Run 10 (4 x H200): does giving NCCL more CTAs shorten the exposed collectives?
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0
B=/tmp/b
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_BUILD_TESTS=OFF > $OUT/build.log 2>&1 && timeout 240 cmake --build $B -j48 --target thdcp_cli >> $OUT/build.log 2>&1 || { grep -E "error|FAILED" $OUT/build.log | head -30; exit 1; }
echo "build $SECONDS s"
for ctas in default 32; do
  if [ $ctas = default ]; then unset NCCL_MIN_CTAS NCCL_MAX_CTAS; else export NCCL_MIN_CTAS=$ctas NCCL_MAX_CTAS=$ctas; fi
  timeout 200 $B/thdcp bench --scaling --gpus 2,4 --kv kept --tokens 131072 --iters 10 > $OUT/scaling_$ctas.log 2>&1; echo "ctas $ctas rc=$? at $SECONDS s"
  grep -E "^\| 131072" $OUT/scaling_$ctas.log | awk -F'|' '{print $3,$4,$12,$14,$19,$20}' | head -8
  grep -E "^collectives" $OUT/scaling_$ctas.log
  NCCL_DEBUG=INFO timeout 60 $B/thdcp bench --scaling --gpus 4 --kv kept --tokens 131072 --mask causal --iters 2 --warmup 1 2>&1 | grep -iE "channels|nchannels|CTAs" | sort | uniq | head -4
done
echo "done at $SECONDS s"
