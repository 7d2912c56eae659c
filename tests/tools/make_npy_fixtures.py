#!/usr/bin/env python3
"""Writes the .npy fixtures of test_tools_io with the real NumPy (python3 -m pip install numpy).

The values follow formulas that tests/tools/test_npy.cpp recomputes, so the C++ reader is
checked against files NumPy wrote, even where NumPy is not installed. Run from anywhere:
    python3 tests/tools/make_npy_fixtures.py
"""
import os

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def save(name, array, version=None):
    path = os.path.join(HERE, name)
    if version is None:
        np.save(path, array)  # NumPy picks 1.0 for these small headers
    else:
        with open(path, "wb") as f:
            np.lib.format.write_array(f, array, version=version)
    print("wrote", path, array.dtype.str, array.shape, "version", version or "default")


def main():
    os.makedirs(HERE, exist_ok=True)
    f4 = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.25 - 3).astype("<f4")  # value(i) = i/4 - 3
    save("f4_v1.npy", f4)
    save("f2_v1.npy", f4.astype("<f2"))  # exact in float16
    # bfloat16 bits: the top 16 bits of float32 (exact for these values); value(i) = i/2 - 1.
    bf = (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(3, 2)
    save("u2_bf16_v1.npy", (bf.view(np.uint32) >> 16).astype("<u2"))
    save("i4_v1.npy", np.array([0, 5, 12, 20], dtype="<i4"))
    save("i8_v1.npy", np.array([0, 2**40, -3], dtype="<i8"))
    save("f4_v2.npy", f4.reshape(6, 4), version=(2, 0))
    save("i4_v3.npy", np.array([7, -8, 9], dtype="<i4"), version=(3, 0))
    save("f4_scalar_v1.npy", np.array(2.5, dtype="<f4"))
    # Inputs the reader must reject, with a message.
    save("bad_big_endian.npy", f4.astype(">f4"))
    save("bad_fortran.npy", np.asfortranarray(f4))
    save("bad_float64.npy", f4.astype("<f8"))


if __name__ == "__main__":
    main()
