#!/usr/bin/env bash
# Installs what the build needs when it is missing (Debian/Ubuntu, via apt-get), then
# configures and builds thdcp into ./build, and says which parts it built. Safe to run again:
# it only installs what is missing and rebuilds what changed.
#
#   scripts/build.sh [--no-mpi] [--no-nccl] [--no-cuda] [extra cmake -D options]
#
# Parts: MPI (Open MPI, installed when missing) is built unless --no-mpi; CUDA when nvcc is
# found (it is never installed) unless --no-cuda, and with it NCCL unless --no-nccl; the
# PyTorch package's operators when python3 can import torch. A part that is asked for and
# cannot be had stops the build with what is missing and how to skip it: nothing is left out
# in silence. THDCP_NO_MPI=1, THDCP_NO_NCCL=1 and THDCP_NO_CUDA=1 do what the flags do, and so
# do -DTHDCP_WITH_MPI=OFF (NCCL, CUDA) among the cmake options.
set -euo pipefail
cd "$(dirname "$0")/.."

want_mpi=1; want_nccl=1; want_cuda=1
[ "${THDCP_NO_MPI:-0}" = 1 ] && want_mpi=0
[ "${THDCP_NO_NCCL:-0}" = 1 ] && want_nccl=0
[ "${THDCP_NO_CUDA:-0}" = 1 ] && want_cuda=0
cmake_args=()
for arg in "$@"; do
  case "$arg" in
    --no-mpi) want_mpi=0 ;;
    --no-nccl) want_nccl=0 ;;
    --no-cuda) want_cuda=0 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -DTHDCP_WITH_MPI=OFF) want_mpi=0 ;;
    -DTHDCP_WITH_NCCL=OFF) want_nccl=0 ;;
    -DTHDCP_WITH_CUDA=OFF) want_cuda=0 ;;
    --no-*|[!-]*) echo "build.sh: unknown argument '$arg': use --no-mpi, --no-nccl, --no-cuda or cmake options (see --help)" >&2
       exit 2 ;;
    *) cmake_args+=("$arg") ;;
  esac
done

fail() {
  echo "build.sh: error: $*" >&2
  exit 1
}

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# apt-get, waiting (up to 5 minutes, saying so) while another apt or dpkg holds its lock:
# on a fresh cloud machine the unattended upgrades often do for the first minutes.
lock_wait_s=300
apt_get() {
  local start=$SECONDS said=0 output status
  while true; do
    set +e
    output=$(DEBIAN_FRONTEND=noninteractive $sudo apt-get "$@" 2>&1)
    status=$?
    set -e
    if [ $status -eq 0 ]; then return 0; fi
    if ! printf '%s' "$output" | grep -qiE 'could not get lock|unable to acquire|is another process using it'; then
      printf '%s\n' "$output" | tail -n 5 >&2
      return $status
    fi
    if [ $((SECONDS - start)) -ge $lock_wait_s ]; then
      echo "build.sh: another apt or dpkg still holds its lock after $((lock_wait_s / 60)) minutes:" >&2
      printf '%s\n' "$output" | grep -iE 'lock' | head -n 2 >&2
      return $status
    fi
    if [ $said -eq 0 ]; then
      echo "build.sh: another apt or dpkg holds its lock; waiting for it (up to $((lock_wait_s / 60)) minutes)"
      said=1
    fi
    sleep 5
  done
}
updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  if [ $updated -eq 0 ]; then
    apt_get update -qq || return 1
    updated=1
  fi
  apt_get install -y -qq --no-install-recommends "$@"
}

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)  # the CLI tests check files with it
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || need+=(libgtest-dev)
have_mpi() { command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; }
if [ $want_mpi -eq 1 ] && ! have_mpi; then need+=(libopenmpi-dev openmpi-bin); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "build.sh: installing ${need[*]}"
  apt_install "${need[@]}" || echo "build.sh: apt-get could not install ${need[*]}" >&2
fi
for tool in cmake ninja g++ python3; do
  command -v $tool >/dev/null 2>&1 || fail "$tool is missing and could not be installed: install it and run build.sh again"
done
if [ $want_mpi -eq 1 ] && ! have_mpi; then
  fail "MPI is missing (no mpicxx and mpirun) and could not be installed (apt-get install libopenmpi-dev" \
       "openmpi-bin): install an MPI, or build without it: scripts/build.sh --no-mpi (or THDCP_NO_MPI=1)"
fi

# NumPy for the python3 that the tests run (the first on PATH: a venv's or pyenv's python3
# does not see Debian's python3-numpy): its pip, then pip past Debian's externally-managed
# guard, then Debian's package (which serves /usr/bin/python3 only).
python=$(command -v python3)
if ! "$python" -c 'import numpy' >/dev/null 2>&1; then
  echo "build.sh: installing NumPy for $python"
  "$python" -m pip install -q numpy >/dev/null 2>&1 ||
    "$python" -m pip install -q --break-system-packages numpy >/dev/null 2>&1 ||
    apt_install python3-numpy >/dev/null 2>&1 || true
  "$python" -c 'import numpy' >/dev/null 2>&1 ||
    echo "build.sh: warning: NumPy could not be installed for $python; the test npy_numpy_interop will be skipped" >&2
fi

# venv with pip for the install test (Debian's python3 has it in python3-venv).
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  echo "build.sh: installing python3-venv for $python"
  apt_install python3-venv >/dev/null 2>&1 || true
  "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 ||
    echo "build.sh: warning: $python cannot make a venv with pip; the test install_clean_venv will be skipped" >&2
fi

# CUDA when nvcc is found (on PATH, or where the toolkit installs it).
nvcc=""
if [ $want_cuda -eq 1 ]; then
  nvcc=$(command -v nvcc 2>/dev/null || true)
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
fi
parts=(-DPython3_EXECUTABLE="$python" -DPython_EXECUTABLE="$python")
if [ -n "$nvcc" ]; then
  parts+=(-DTHDCP_WITH_CUDA=ON)
  command -v nvcc >/dev/null 2>&1 || parts+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  if [ $want_nccl -eq 1 ]; then parts+=(-DTHDCP_WITH_NCCL=ON); else parts+=(-DTHDCP_WITH_NCCL=OFF); fi
else
  parts+=(-DTHDCP_WITH_CUDA=OFF -DTHDCP_WITH_NCCL=OFF)
fi
if [ $want_mpi -eq 1 ]; then parts+=(-DTHDCP_WITH_MPI=ON); else parts+=(-DTHDCP_WITH_MPI=OFF); fi
# The PyTorch package's operators are built (and tested, label torch) when python3 has PyTorch.
python_package=OFF
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) && python_package=ON

log=build/configure.log
mkdir -p build
if ! cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTHDCP_BUILD_PYTHON=$python_package "${parts[@]}" \
     ${cmake_args[@]+"${cmake_args[@]}"} 2>&1 | tee "$log"; then
  skip=()
  if [ -n "$nvcc" ]; then
    skip+=("CUDA: --no-cuda")
    if [ $want_nccl -eq 1 ]; then skip+=("NCCL: --no-nccl"); fi
  fi
  if [ $want_mpi -eq 1 ]; then skip+=("MPI: --no-mpi"); fi
  fail "configuring failed (above; also in $log). To leave out a part that is missing:" \
       "${skip[*]:-(none was asked for)}"
fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build build -j "$jobs"

yes_no() { if [ "$1" = TRUE ]; then echo yes; else echo "no ($2)"; fi; }
summary=$(grep -oE 'thdcp: CUDA=[A-Z]+ MPI=[A-Z]+ NCCL=[A-Z]+' "$log" | tail -n 1)
have() { printf '%s' "$summary" | grep -oE "$1=[A-Z]+" | cut -d= -f2; }
echo "build.sh: built ./build:"
echo "  CUDA             $(yes_no "$(have CUDA)" "$([ $want_cuda -eq 1 ] && echo 'nvcc not found' || echo 'skipped: --no-cuda')")"
echo "  NCCL             $(yes_no "$(have NCCL)" "$([ "$(have CUDA)" != TRUE ] && echo 'no CUDA' || echo 'skipped: --no-nccl')")"
echo "  MPI              $(yes_no "$(have MPI)" 'skipped: --no-mpi')"
if [ $python_package = ON ]; then
  echo "  PyTorch package  yes (torch $torch_version, $python)"
else
  echo "  PyTorch package  no ($python cannot import torch: install PyTorch and run build.sh again to build it)"
fi
