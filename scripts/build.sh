#!/usr/bin/env bash
# Installs what the build needs when it is missing (Debian/Ubuntu, via apt-get), then
# configures and builds thdcp into ./build. Safe to run again: it only installs what is
# missing and rebuilds what changed.
#   scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)  # the CLI tests check files with it
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in libgtest-dev libopenmpi-dev openmpi-bin; do
    have_pkg "$pkg" || need+=("$pkg")
  done
fi
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "build.sh: missing ${need[*]} and no apt-get to install them; install them and run again" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "build.sh: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
