#!/usr/bin/env bash
# The PyTorch package on a GPU machine, end to end (logs under OUTDIR):
#   1. build the project with the package's operators (THDCP_BUILD_PYTHON=ON) and run the
#      torch-labelled tests (pytest with CUDA cases; cp_attention under torchrun);
#   2. the README's install on a fresh copy of the sources: pip install --no-build-isolation .
#   3. the README's example: python examples/train_packed.py (and under torchrun with every
#      visible GPU when there are several).
#   scripts/torch-check.sh OUTDIR [build|install|all]
set -uo pipefail
out=${1:?OUTDIR}; what=${2:-all}
mkdir -p "$out"
src=$(cd "$(dirname "$0")/.." && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt" 2>&1
python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())' >> "$out/gpu.txt" 2>&1
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [[ $what == build || $what == all ]]; then
  b=/tmp/thdcp-torch-build
  { cmake -S "$src" -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_BUILD_PYTHON=ON &&
    cmake --build $b -j"$(nproc)"; } > "$out/build.log" 2>&1 || { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
  (cd $b && ctest -L torch --output-on-failure --timeout 900) > "$out/ctest-torch.log" 2>&1 || status=1
  tail -12 "$out/ctest-torch.log"
  (cd $b && ctest -R 'nccl\.|capi|consumer' --output-on-failure -j4 --timeout 600) > "$out/ctest-nccl-capi.log" 2>&1 || status=1
  tail -5 "$out/ctest-nccl-capi.log"
fi
if [[ $what == install || $what == all ]]; then
  fresh=/tmp/thdcp-fresh
  rm -rf $fresh && mkdir -p $fresh
  (cd "$src" && tar --exclude='./build*' --exclude=./.git -cf - .) | tar -C $fresh -xf -
  start=$(date +%s)
  (cd $fresh && python3 -m pip install --no-build-isolation . ) > "$out/install.log" 2>&1 ||
    { echo "pip install failed"; tail -30 "$out/install.log"; exit 1; }
  echo "pip install: $(( $(date +%s) - start )) s" | tee -a "$out/install.log"
  tail -2 "$out/install.log"
  cd /tmp
  python3 $fresh/examples/train_packed.py 2>&1 | tee "$out/example-1gpu.log" || status=1
  if (( gpus >= 2 )); then
    python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" $fresh/examples/train_packed.py \
      2>&1 | tee "$out/example-${gpus}gpu.log" || status=1
  fi
fi
exit $status
