#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, -fsanitize=fuzzer,address,undefined, no
# CUDA) into BUILD, runs each once over its seed corpus (ctest -L fuzz), then fuzzes each for
# SECONDS (default 60). The seeds are copied to BUILD/fuzz/<target>/seeds and new inputs go to
# BUILD/fuzz/<target>/corpus (kept between runs, so a longer run goes on from there); nothing
# is written into the source tree. Any finding (a crash, a sanitizer report, a leak, a
# FUZZ_CHECK, a timeout of -timeout seconds, an allocation over -malloc_limit_mb or a process
# over -rss_limit_mb) fails the run and prints the input's path and how to reproduce it.
#   tests/fuzz/run.sh SOURCE BUILD [SECONDS]
# Longer runs: tests/fuzz/run.sh . build-fuzz 3600   (per target; docs/testing.md#fuzzing)
set -euo pipefail
source_dir=$(realpath "$1")
build_dir=$(realpath -m "$2")
seconds=${3:-60}
targets=(fuzz_npy fuzz_lengths fuzz_capi)

# libFuzzer comes with clang (Debian: clang and libclang-rt-<version>-dev, which .ci/run
# installs when they are missing).
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' > "$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2> "$probe/log"; then
  echo "fuzz: clang++ cannot link a libFuzzer target (-fsanitize=fuzzer):" >&2
  cat "$probe/log" >&2
  echo "fuzz: install clang and its runtime (Debian: apt-get install clang libclang-rt-dev)" >&2
  exit 1
fi

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
launcher=()
command -v ccache > /dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$build_dir"
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang "${launcher[@]}" \
  -DTHDCP_WITH_CUDA=OFF -DTHDCP_WITH_MPI=OFF -DTHDCP_BUILD_FUZZERS=ON \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > "$build_dir.configure.log"
cmake --build "$build_dir" --target thdcp_fuzzers -j "$(nproc 2>/dev/null || echo 2)" > "$build_dir.build.log"

export ASAN_OPTIONS=detect_stack_use_after_return=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Every seed still runs clean.
ctest --test-dir "$build_dir" -L fuzz --output-on-failure

# Per target: the largest input, and the memory a finding is: one allocation over
# malloc_limit_mb, or the process over rss_limit_mb (ASan's own memory included).
declare -A max_len=([fuzz_npy]=16384 [fuzz_lengths]=4096 [fuzz_capi]=2048)
failed=()
summary=()
for target in "${targets[@]}"; do
  work="$build_dir/fuzz/$target"
  rm -rf "$work/seeds"
  mkdir -p "$work/seeds" "$work/corpus" "$work/findings"
  cp "$source_dir/tests/fuzz/corpus/$target/"* "$work/seeds/"
  dict=()
  [ -f "$source_dir/tests/fuzz/$target.dict" ] && dict=(-dict="$source_dir/tests/fuzz/$target.dict")
  log="$work/fuzz.log"
  echo "fuzz: $target for ${seconds} s (log: $log)"
  status=0
  timeout $((seconds + 300)) "$build_dir/tests/fuzz/$target" "$work/corpus" "$work/seeds" "${dict[@]}" \
    -max_total_time="$seconds" -max_len="${max_len[$target]}" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$work/findings/" > "$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  coverage=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1 || true)
  summary+=("$target: ${execs:-?} exec/s, ${coverage:-no coverage line}, $(find "$work/corpus" -type f | wc -l) inputs in its corpus")
  if [ "$status" -ne 0 ]; then
    failed+=("$target")
    echo "fuzz: $target FAILED (exit $status):" >&2
    grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY|Test unit written' "$log" | head -20 >&2 || true
    for input in "$work/findings/"*; do
      [ -e "$input" ] || continue
      echo "fuzz: finding: $input" >&2
      echo "fuzz:   reproduce: THDCP_FUZZ_TRACE=1 $build_dir/tests/fuzz/$target $input" >&2
    done
  fi
done
printf 'fuzz: %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs under $build_dir/fuzz/<target>/findings/)" >&2
  exit 1
fi
