#!/usr/bin/env bash
# Installs what the build needs when it is missing (Debian/Ubuntu, via apt-get), then
# configures and builds thdcp into ./build. Safe to run again: it only installs what is
# missing and rebuilds what changed. CUDA (nvcc) is used when found; it is never installed.
#   scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)  # the CLI tests check files with it
python3 -c 'import numpy' >/dev/null 2>&1 || need+=(python3-numpy)  # the README's example, npy interop
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || need+=(libgtest-dev)
{ command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; } || need+=(libopenmpi-dev openmpi-bin)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "build.sh: installing ${need[*]}"
  if ! { command -v apt-get >/dev/null 2>&1 && $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
    # MPI is optional (THDCP_WITH_MPI=AUTO); CMake says what else is missing.
    echo "build.sh: could not install ${need[*]}; trying to build with what is there" >&2
  fi
fi

# The PyTorch package's operators are built (and tested, label torch) when python3 has PyTorch.
python_package=OFF
python3 -c 'import torch' >/dev/null 2>&1 && python_package=ON
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_BUILD_PYTHON=$python_package "$@"
cmake --build build -j "$jobs"
