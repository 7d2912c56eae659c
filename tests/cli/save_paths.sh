#!/usr/bin/env bash
# save_paths.sh CASE THDCP WORKDIR: --save into paths that used to fail after the whole run
# (issue 28, class 5).
#   cross_device: DIR is a symbolic link to a directory on another file system (/dev/shm, a
#     tmpfs), and DIR/new/ a new directory there: before, the staging directory was made beside
#     DIR and every rename failed with "Invalid cross-device link". Skipped (77) without a
#     /dev/shm on another file system than WORKDIR.
#   trailing_slash: --save NEWDIR/ creates NEWDIR (before: "its parent 'NEWDIR' does not exist").
set -u
case=$1; thdcp=$2; work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
flags=(run --backend cpu --tokens 64 --cp 2 --heads 1:1 --head-dim 8)
expect_saved() {  # DIR: the 12 files of --save, and no staging left beside or inside
  local n
  n=$(ls "$1" | grep -c '\.npy$')
  if [ "$n" -ne 12 ]; then echo "FAIL: $1 holds $n .npy files, not 12: $(ls -A "$1")"; exit 1; fi
  local left
  left=$( (ls -A "$1"; ls -A "$(dirname "$1")") | grep '\.tmp\|\.thdcp-')
  if [ -n "$left" ]; then echo "FAIL: staging left: $left"; exit 1; fi
}
case $case in
  cross_device)
    if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then echo "no writable /dev/shm"; exit 77; fi
    if [ "$(stat -c %d /dev/shm)" = "$(stat -c %d "$work")" ]; then
      echo "/dev/shm is on the same file system as $work"; exit 77
    fi
    target=$(mktemp -d /dev/shm/thdcp-save-XXXXXX) || exit 1
    trap 'rm -rf "$target"' EXIT
    ln -s "$target" "$work/link"
    "$thdcp" "${flags[@]}" --save "$work/link" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; echo "FAIL: --save LINK"; exit 1; }
    expect_saved "$target"
    "$thdcp" "${flags[@]}" --save "$work/link/new/" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; echo "FAIL: --save LINK/new/"; exit 1; }
    expect_saved "$target/new"
    echo "ok: saved through a link to $(stat -f -c %T /dev/shm), twice" ;;
  trailing_slash)
    "$thdcp" "${flags[@]}" --save "$work/newdir/" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; echo "FAIL: --save NEWDIR/"; exit 1; }
    expect_saved "$work/newdir"
    echo "ok: --save NEWDIR/ created NEWDIR" ;;
  *) echo "unknown case $case"; exit 1 ;;
esac
