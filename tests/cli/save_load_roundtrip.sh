#!/usr/bin/env bash
# `thdcp run --save` then `thdcp run --load` of the saved inputs reproduces the saved outputs
# bit for bit (same CP size), and a failing run writes nothing to --save.
#   save_load_roundtrip.sh THDCP WORKDIR
set -euo pipefail
thdcp="$1"; work="$2"
rm -rf "$work"; mkdir -p "$work"
flags=(--cp 3 --heads 4:2 --head-dim 32 --window 40,8)
"$thdcp" run --tokens 2400 --seed 9 "${flags[@]}" --save "$work/first" >/dev/null
"$thdcp" run --load "$work/first" "${flags[@]}" --save "$work/second" >/dev/null
for f in q k v dout cu_seqlens cu_seqlens_padded out lse max_logit dq dk dv; do
  cmp "$work/first/$f.npy" "$work/second/$f.npy" || { echo "$f.npy differs after --save/--load"; exit 1; }
done
echo "save/load: all 12 files identical"
# A run that fails on bad input leaves no --save directory behind.
if "$thdcp" run --load "$work/first" --heads 8:2 --save "$work/never" >/dev/null 2>&1; then
  echo "expected --heads 8:2 to be rejected for 4:2 files"; exit 1
fi
[ ! -e "$work/never" ] || { echo "--save directory written by a failed run"; exit 1; }
echo "failed run wrote nothing"
