#!/usr/bin/env python3
"""Test npy_numpy_interop: thdcp's .npy files against the real NumPy, both ways.

usage: check_npy_interop.py PATH/TO/npy_interop
Exit 0 pass, 1 fail, 77 skipped (no NumPy: python3 -m pip install numpy).
The value formulas repeat those of npy_interop.cpp.
"""
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping (python3 -m pip install numpy)")
    sys.exit(77)

CASES = [("f4", "<f4", (3, 5, 2)), ("f2", "<f2", (4, 3)), ("u2", "<u2", (7,)), ("i4", "<i4", (2, 5)), ("i8", "<i8", (6,))]


def expected(name, descr, shape):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    if name in ("f4", "f2"):
        v = i * 0.5 - 7
    elif name == "u2":
        v = i * 3
    elif name == "i4":
        v = i * i - 10
    else:
        v = i * (1 << 33) - 5
    return v.astype(descr).reshape(shape)


def main():
    tool = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as ours, tempfile.TemporaryDirectory() as theirs:
        subprocess.run([tool, "write", ours], check=True)
        for name, descr, shape in CASES:
            a = np.load("%s/%s.npy" % (ours, name))
            want = expected(name, descr, shape)
            if a.dtype.str != descr or a.shape != shape or not np.array_equal(a, want):
                failures.append("numpy read %s.npy as %s %s: %r" % (name, a.dtype.str, a.shape, a.ravel()[:4]))
            for version in (1, 2, 3):
                with open("%s/%s_v%d.npy" % (theirs, name, version), "wb") as f:
                    np.lib.format.write_array(f, want, version=(version, 0))
        result = subprocess.run([tool, "read", theirs])
        if result.returncode != 0:
            failures.append("npy_interop could not read the files numpy wrote (see above)")
    for f in failures:
        print("FAIL:", f)
    print("npy interop with numpy %s: %s" % (np.__version__, "FAIL" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
