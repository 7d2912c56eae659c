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
