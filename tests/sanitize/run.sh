#!/usr/bin/env bash
# ASan + UBSan (run by .ci/run after the main suite): builds the CPU parts of the tree at SOURCE into BUILD (no CUDA: the sanitizers
# check host code; -fno-sanitize-recover makes any finding fatal) and runs the CPU suite there,
# the hostile-input CLI cases included. Any sanitizer report fails the test.
#   tests/sanitize/run.sh SOURCE BUILD
set -euo pipefail
source_dir=$1
build_dir=$2
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTHDCP_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$build_dir.configure.log"
cmake --build "$build_dir" -j "$(nproc 2>/dev/null || echo 2)" > "$build_dir.build.log"
# Leak checks stay on; detect_stack_use_after_return catches more of the threaded code.
export ASAN_OPTIONS=detect_stack_use_after_return=1:abort_on_error=0:exitcode=86
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87
jobs=$(nproc 2>/dev/null || echo 2)
# Excluded: the thread-limit test (an address-space limit that ASan's shadow memory cannot
# meet) and the peak-memory test (ASan's own memory). Open MPI's libraries leak at exit, so
# the MPI cases run without the leak check; everything else with it. The README's mpirun line
# (cli_readme_mpirun: the default 16384-row job, half a minute unsanitized) runs in the main
# suite only; cli_run_mpi_np2 covers the same code here.
ctest --test-dir "$build_dir" -L cpu -LE mpi -E "thread_limit|memory_in_process" --output-on-failure -j "$jobs" --timeout 900
ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 ctest --test-dir "$build_dir" -L mpi -E readme_mpirun --output-on-failure --timeout 900
