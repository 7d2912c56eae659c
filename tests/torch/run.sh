#!/usr/bin/env bash
# ctest driver of the PyTorch package's tests (label torch).
#   run.sh BUILD_DIR pytest [ARGS]     the pytest suite (CPU cases; CUDA cases with a GPU), ARGS to pytest
#   run.sh BUILD_DIR torchrun N        tests/torch/cp_worker.py under torchrun with N processes
#   run.sh BUILD_DIR example           examples/train_packed.py on one GPU (short)
#   run.sh BUILD_DIR example-no-gpu    the same with every GPU hidden: one line saying what it
#                                      needs, exit 2, no traceback
#   run.sh BUILD_DIR transformers DEV  examples/train_transformers.py in one process on DEV (cpu, cuda)
#   run.sh BUILD_DIR transformers-torchrun N
#                                      examples/train_transformers.py under torchrun, CP over N GPUs
# Exits 77 (ctest: skipped) with the reason when the package was not built, transformers is not
# installed or the GPUs are missing.
set -u
build=$1; mode=$2
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -f "$build/python/thdcp/libthdcp_torch.so" ]]; then
  echo "SKIPPED: the PyTorch package was not built in $build (PyTorch was not importable when configuring;" \
       "install PyTorch and configure with -DTHDCP_BUILD_PYTHON=ON, or run scripts/build.sh again)"
  exit 77
fi
python=${THDCP_PYTHON:-python3}
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
gpus_visible() { "$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0; }
need_transformers() {
  if ! "$python" -c 'import transformers' 2>/dev/null; then
    echo "SKIPPED: Hugging Face transformers is not installed (pip install transformers==5.17.0)"
    exit 77
  fi
}
example_hf="$here/../../examples/train_transformers.py"
case "$mode" in
  transformers)
    need_transformers
    if [[ $3 == cuda ]] && (( $(gpus_visible) < 1 )); then
      echo "SKIPPED: examples/train_transformers.py --device cuda needs a GPU, none visible"
      exit 77
    fi
    if [[ $3 == cpu ]]; then
      exec "$python" "$example_hf" --device cpu --tokens 512 --steps 4 --check-steps 2
    fi
    exec "$python" "$example_hf" --device "$3" --steps 10 ;;
  transformers-torchrun)
    need_transformers
    n=$3
    gpus=$(gpus_visible)
    if (( gpus < n )); then
      echo "SKIPPED: examples/train_transformers.py under torchrun needs $n GPUs, $gpus visible"
      exit 77
    fi
    exec "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" "$example_hf" --steps 10 ;;
  pytest)
    exec "$python" -m pytest -q -p no:cacheprovider "$here" "${@:3}" ;;
  example)
    gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if (( gpus < 1 )); then
      echo "SKIPPED: examples/train_packed.py needs a GPU, none visible"
      exit 77
    fi
    exec "$python" "$here/../../examples/train_packed.py" --steps 9 ;;
  example-no-gpu)
    output=$(CUDA_VISIBLE_DEVICES= "$python" "$here/../../examples/train_packed.py" 2>&1)
    status=$?
    printf '%s\n' "$output"
    if [[ $status -ne 2 || "$output" == *Traceback* || "$output" != *"train_packed.py: needs a CUDA GPU"* ]]; then
      echo "FAIL: expected exit 2 and one line saying it needs a CUDA GPU, got exit $status"
      exit 1
    fi
    exit 0 ;;
  torchrun)
    n=$3
    gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if (( gpus < n )); then
      echo "SKIPPED: cp_worker needs $n GPUs, $gpus visible"
      exit 77
    fi
    exec "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" "$here/cp_worker.py" ;;
esac
echo "run.sh: unknown mode $mode" >&2
exit 2
