"""Writes the bad inputs the CLI tests feed to thdcp (into the directory given)."""
import os
import sys

import npy_min

root = sys.argv[1]
T, H, D = 16, 2, 8


def tensor_dir(name, cu, k_rows=T):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    npy_min.write(os.path.join(d, "q.npy"), "<f4", (T, H, D), [0.5] * (T * H * D))
    npy_min.write(os.path.join(d, "k.npy"), "<f4", (k_rows, H, D), [0.25] * (k_rows * H * D))
    npy_min.write(os.path.join(d, "v.npy"), "<f4", (k_rows, H, D), [1.0] * (k_rows * H * D))
    npy_min.write(os.path.join(d, "cu_seqlens.npy"), "<i4", (len(cu),), cu)
    return d


tensor_dir("cu_too_long", [0, 10, 19])          # cu_seqlens ends past T = 16
tensor_dir("cu_decreasing", [0, 10, 6, 16])     # offsets go down
tensor_dir("k_rows", [0, 16], k_rows=12)        # k has 12 rows, q 16
bad = tensor_dir("not_npy", [0, 16])
with open(os.path.join(bad, "q.npy"), "wb") as f:
    f.write(b"this is not a numpy file\n")
with open(os.path.join(root, "negative.txt"), "w") as f:
    f.write("# lengths\n12\n-5\n")
with open(os.path.join(root, "words.txt"), "w") as f:
    f.write("12\n\nseven\n")
with open(os.path.join(root, "too_long.txt"), "w") as f:
    f.write("100\n20000\n")
with open(os.path.join(root, "few.txt"), "w") as f:
    f.write("100\n200\n")
# Hostile text: control characters, a byte-order mark, one huge value, one huge line.
with open(os.path.join(root, "control.txt"), "wb") as f:
    f.write(b"12\n7\x1b]0;owned\x07\n")
with open(os.path.join(root, "bom.txt"), "wb") as f:
    f.write(b"\xef\xbb\xbf12\n")
with open(os.path.join(root, "long_value.txt"), "w") as f:
    f.write("12\n" + "9" * 5000 + "x\n")
with open(os.path.join(root, "long_line.txt"), "w") as f:
    f.write("12\n" + "1" * 100000 + "\n")
# A FIFO where q.npy should be: opening it would block forever. (A FIFO left by an earlier
# run is removed first: writing the tensors would open it and block.)
fifo_q = os.path.join(root, "fifo", "q.npy")
if os.path.exists(fifo_q):
    os.remove(fifo_q)
fifo = tensor_dir("fifo", [0, 16])
os.remove(fifo_q)
os.mkfifo(fifo_q)
# A --save directory where a directory sits at the name of an output file.
os.makedirs(os.path.join(root, "save_blocked", "q.npy"), exist_ok=True)


def tensors_with(name, q_values=None, k_values=None, cu=(0, 16), cup=None, q_shape=(T, H, D)):
    """A --load directory whose q (or k) holds the given values; optional cu_seqlens_padded."""
    d = tensor_dir(name, list(cu))
    count = q_shape[0] * q_shape[1] * q_shape[2]
    npy_min.write(os.path.join(d, "q.npy"), "<f4", q_shape, q_values if q_values is not None else [0.5] * count)
    if k_values is not None:
        npy_min.write(os.path.join(d, "k.npy"), "<f4", (T, H, D), k_values)
    if cup is not None:
        npy_min.write(os.path.join(d, "cu_seqlens_padded.npy"), "<i4", (len(cup),), list(cup))
    return d


# Non-finite and overflowing values in loaded inputs (refused unless --allow-nonfinite), and a
# NaN in a padding row (accepted: padding is never read).
nan_q = [0.5] * (T * H * D)
nan_q[3 * H * D + 1 * D + 5] = float("nan")       # row 3, head 1, dim 5
tensors_with("nan_q", q_values=nan_q)
inf_k = [0.25] * (T * H * D)
inf_k[7 * H * D] = float("-inf")                  # row 7, head 0, dim 0
tensors_with("inf_k", k_values=inf_k)
huge_q = [0.5] * (T * H * D)
huge_q[2 * H * D + 4] = 3.0e38                    # q.k could overflow fp32
tensors_with("huge_q", q_values=huge_q)
pad_nan = [0.5] * (T * H * D)
pad_nan[15 * H * D] = float("nan")                # row 15: padding (valid rows 0..11)
tensors_with("nan_in_padding", q_values=pad_nan, cu=(0, 12), cup=(0, 16))
# Zero-size inputs.
tensors_with("empty_rows", q_values=[], q_shape=(0, H, D), cu=(0,))
tensors_with("zero_heads", q_values=[], q_shape=(T, 0, D))
