#!/usr/bin/env bash
# clean_venv.sh SOURCE WORK [PYTHON]: the README's install of the PyTorch package, `pip install .`
# from SOURCE, in a fresh virtual environment that has PyTorch and nothing else; then
# `import thdcp` and one CPU attention call, forward and backward, against plain PyTorch
# (check_call.py). Built CPU-only (-C cmake.define.THDCP_WITH_CUDA=OFF) to fit CI's time, with
# pip's build isolation as the README gives it (scikit-build-core comes from PyPI), no pip
# cache and no ccache: the time printed is a cold build's.
#
# The venv is made without --system-site-packages. PyTorch is not downloaded into it (torch
# 2.11 with its CUDA wheels is about 4 GB): the PyTorch of PYTHON (default python3), and
# exactly the distributions its metadata requires, are linked into WORK/torch
# (torch_overlay.py) and put on the venv's path by one .pth file. So the venv holds what
# `pip install torch` would have put there, and pip sees torch installed as it would; nothing
# else of PYTHON's site-packages is visible (this script checks that NumPy, scikit-build-core
# and pytest cannot be imported before, and scikit-build-core not after the install).
#
# Exit 77 (skipped, with the reason) where PYTHON has no PyTorch or no venv module, or PyPI
# cannot be reached for scikit-build-core.
set -u
source_dir=$(cd "$1" && pwd); work="$2"; python="${3:-python3}"
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

"$python" -c 'import torch' >/dev/null 2>&1 || skip "$python cannot import torch: no PyTorch to put in the venv"
start=$SECONDS
rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
"$python" -m venv "$work/venv" >"$work/venv.log" 2>&1 || skip "$python -m venv failed: $(tail -n 1 "$work/venv.log")"
venv_python="$work/venv/bin/python"
own=$("$venv_python" -c 'import importlib.metadata as m; print(" ".join(d.metadata["Name"] for d in m.distributions()))')
"$python" "$here/torch_overlay.py" "$work/torch" $own || fail "could not link PyTorch into $work/torch"
site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$work/torch" >"$site/torch.pth"
"$venv_python" -c 'import torch' >/dev/null 2>&1 || fail "the venv cannot import the linked torch"
for module in numpy scikit_build_core pytest thdcp; do
  if "$venv_python" -c "import $module" >/dev/null 2>&1; then fail "the fresh venv can import $module: it is not clean"; fi
done
echo "venv ready in $((SECONDS - start)) s: $("$venv_python" -m pip --version | cut -d' ' -f1-2), torch $("$venv_python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"

build_start=$SECONDS
cd "$source_dir" || fail "cannot enter $source_dir"
if ! CCACHE_DISABLE=1 "$venv_python" -m pip install --no-cache-dir -v . -C cmake.define.THDCP_WITH_CUDA=OFF \
     -C build-dir="$work/build" >"$work/pip.log" 2>&1; then
  if grep -qiE 'no matching distribution found for scikit-build-core|Failed to establish a new connection|Temporary failure in name resolution' "$work/pip.log"; then
    skip "PyPI cannot be reached for scikit-build-core (pip's build isolation fetches it): $(grep -m1 -iE 'error|failed' "$work/pip.log")"
  fi
  tail -n 40 "$work/pip.log"
  fail "pip install . failed (the whole log: $work/pip.log)"
fi
build_s=$((SECONDS - build_start))
grep -E 'thdcp: PyTorch from|Successfully installed' "$work/pip.log"
grep -c '^ *\[[0-9]*/[0-9]*\] ' "$work/pip.log" | xargs printf 'pip showed %s Ninja progress lines\n'
if "$venv_python" -c 'import scikit_build_core' >/dev/null 2>&1; then
  fail "scikit-build-core is in the venv: build isolation should have kept it in the build's environment"
fi

cd "$work" || exit 1
"$venv_python" "$here/check_call.py" >"$work/call.log" 2>&1
status=$?
# torch warns at import that NumPy is missing: it is, in a venv with PyTorch alone.
grep -v 'Failed to initialize NumPy\|_conversion_method_template' "$work/call.log"
[ $status -eq 0 ] || fail "the CPU call of the installed thdcp does not match plain PyTorch"
echo "PASS: pip install . took ${build_s} s (cold, CPU-only), the whole test $((SECONDS - start)) s"
