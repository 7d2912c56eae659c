#!/usr/bin/env bash
# The installed CMake package, used the way a user's project uses it (ctest: consumer_package).
#   tests/consumer/run.sh BUILD_DIR WORK_DIR
# BUILD_DIR: a configured and built thdcp. WORK_DIR: scratch space (what an earlier run left
# there is removed first).
#  1. cmake --install BUILD_DIR (components devel and runtime only) into WORK_DIR/prefix;
#     the tree holds the CMake files and the headers, but not include/thdcp/testing/;
#  2. configures tests/consumer against that prefix alone (CMAKE_PREFIX_PATH, no package
#     registry), builds it and runs its programs (consumer; c_consumer with the C ABI);
#     no compile command may name the source tree's include/;
#  3. configures it again asking for versions the package must refuse (9.0, 0.1, 0.3) and a
#     component it does not have;
#  4. builds and runs the consumer against the build tree's own export (-Dthdcp_DIR=BUILD_DIR).
# Environment: CMAKE (default: cmake); CMAKE_GENERATOR, CXX, CXXFLAGS, LDFLAGS and
# CUDAToolkit_ROOT as for cmake (ctest passes those of the build); JOBS (default 2).
# Any failure prints what failed and exits non-zero.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
cmake=${CMAKE:-cmake}
jobs=${JOBS:-2}
here=$(cd "$(dirname "$0")" && pwd)
source_root=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
prefix=$work/prefix

fail() {
  echo "consumer_package: FAIL: $*" >&2
  exit 1
}
step() { echo "== $*"; }
# build_consumer DIR WHAT: builds the consumer configured in DIR against WHAT.
build_consumer() {
  "$cmake" --build "$1" -j "$jobs" || fail "building the consumer against $2 failed"
}
# run_programs DIR WHAT: runs every program the consumer in DIR lists (programs.txt); WHAT
# says which package it was built against.
run_programs() {
  while IFS= read -r program; do
    [ -n "$program" ] || continue
    echo "-- $program"
    "$program" || fail "$(basename "$program") failed ($2)"
  done <"$1/programs.txt"
}

[ -f "$build/CMakeCache.txt" ] || fail "$build is not a configured thdcp build directory"
rm -rf "$prefix" "$work/build" "$work/build-reject" "$work/build-tree"

step "1. install $build into $prefix (components devel, runtime)"
for component in devel runtime; do
  if ! "$cmake" --install "$build" --prefix "$prefix" --component "$component" >"$work/install-$component.log" 2>&1; then
    cat "$work/install-$component.log" >&2
    fail "cmake --install (component $component) failed: is $build fully built? (cmake --build $build)"
  fi
done
config=$(find "$prefix" -name thdcpConfig.cmake -print -quit)
[ -n "$config" ] || fail "no thdcpConfig.cmake under $prefix"
[ -f "$(dirname "$config")/thdcpConfigVersion.cmake" ] || fail "no thdcpConfigVersion.cmake next to $config"
[ -f "$prefix/include/thdcp/cpu/attention.h" ] || fail "$prefix/include/thdcp/cpu/attention.h was not installed"
[ ! -e "$prefix/include/thdcp/testing" ] || fail "include/thdcp/testing/ (test support) was installed"
echo "installed: $(find "$prefix" -type f | wc -l) files; config $config"

step "2. configure, build and run tests/consumer against $prefix"
"$cmake" -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DTHDCP_CONSUMER_EXPECT_DIR="$prefix" ||
  fail "configuring the consumer against $prefix failed"
build_consumer "$work/build" "$prefix"
commands=$work/build/compile_commands.json
[ -f "$commands" ] || fail "no $commands"
if grep -F -e "$source_root/include" -e "$source_root/src" "$commands"; then
  fail "a compile command above uses the source tree ($source_root/include or src), not the installed headers"
fi
grep -q -F "$prefix/include" "$commands" || fail "no compile command uses $prefix/include"
echo "compile commands use $prefix/include and nothing from $source_root/include or src"
run_programs "$work/build" "installed package"

step "3. versions and components the package must refuse"
"$cmake" -S "$here" -B "$work/build-reject" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DTHDCP_CONSUMER_REJECT=1 >"$work/reject.log" 2>&1 || { cat "$work/reject.log" >&2; fail "the refusal checks failed"; }
grep "consumer:" "$work/reject.log"
grep -q "consumer: REJECT PASS" "$work/reject.log" || fail "the refusal checks did not finish"

step "4. the build tree's export (-Dthdcp_DIR=$build)"
"$cmake" -S "$here" -B "$work/build-tree" -Dthdcp_DIR="$build" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DTHDCP_CONSUMER_EXPECT_DIR="$build" -DTHDCP_CONSUMER_ALL_HEADERS=OFF ||
  fail "configuring the consumer against the build tree failed"
build_consumer "$work/build-tree" "the build tree"
run_programs "$work/build-tree" "build tree"

echo "consumer_package: PASS"
