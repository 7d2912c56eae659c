#!/usr/bin/env bash
# readme_mpirun.sh README BUILD_DIR MPIEXEC WORK: runs the README's mpirun line exactly as
# written (issue 29: it failed as root and on few cores, the flags it needed only in a
# comment). The line is read from README, not copied here; it runs in WORK, where ./build is
# BUILD_DIR, with the mpirun CMake found first on PATH and none of the OMPI_ variables that
# would allow root or oversubscription from outside the line. It must exit 0 with every
# check passed, over the MPI (or NCCL) communicator.
set -u
readme="$1"; build_dir="$2"; mpiexec="$3"; work="$4"
line=$(grep -m1 -E '^mpirun ' "$readme") || { echo "FAIL: no line starting with 'mpirun ' in $readme"; exit 1; }
echo "README: $line"
rm -rf "$work" && mkdir -p "$work" && ln -s "$build_dir" "$work/build" || exit 1
cd "$work" || exit 1
output=$(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -u OMPI_MCA_rmaps_base_oversubscribe \
  PATH="$(dirname "$mpiexec"):$PATH" timeout 280 bash -c "$line" 2>&1)
status=$?
echo "exit $status as $(id -un) on $(nproc) cores"
if [ "$status" -ne 0 ] || ! printf '%s' "$output" | grep -Eq '(mpi|nccl \(a process per GPU\)) communicator' ||
   ! printf '%s' "$output" | grep -q '^result: PASS'; then
  printf 'FAIL: the README line did not run as written:\n%s\n' "$output"
  exit 1
fi
printf '%s\n' "$output" | head -n 2
echo PASS
