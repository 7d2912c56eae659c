"""Writes the hostile inputs of issue 28 (classes 1 and 6) into the directory given: big files
are sparse (truncated to size: no disk blocks), so making them costs nothing.

Class 1, memory before validation: a 3 GiB file with a wrong magic number, headers that
promise more data than their file holds or less, a 10 MB header, 10^7 zero-length sequences,
a 6 GiB set of tensors, an 11-byte lengths file of one 2^31-1 token document.
Class 6, raw bytes: escape sequences in an .npy header's text, descr and key, and in a file name."""
import os
import struct
import sys

import npy_min

root = sys.argv[1]
T, H, D = 16, 2, 8
ESC_TITLE = "\x1b]0;owned\x07\x1b[2J"  # sets the terminal title, clears the screen
GIB = 1 << 30


def header_bytes(dict_text, version=1):
    """Magic, version, length and the header `dict_text` padded as NumPy pads it."""
    prefix = 10 if version == 1 else 12
    text = dict_text + " " * ((64 - (prefix + len(dict_text) + 1) % 64) % 64) + "\n"
    raw = text.encode("latin1")
    length = struct.pack("<H", len(raw)) if version == 1 else struct.pack("<I", len(raw))
    return b"\x93NUMPY" + bytes([version, 0]) + length + raw


def dict_for(descr, shape):
    dims = "(%d,)" % shape[0] if len(shape) == 1 else "(%s)" % ", ".join(str(s) for s in shape)
    return "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, dims)


def sparse(path, head, size):
    """`head` at the start of a file of `size` bytes (the rest a hole of zeros)."""
    if os.path.exists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.write(head)
    os.truncate(path, size)


def load_dir(name, cu=(0, T)):
    """A valid small --load directory; the caller replaces one of its files."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    npy_min.write(os.path.join(d, "q.npy"), "<f4", (T, H, D), [0.5] * (T * H * D))
    npy_min.write(os.path.join(d, "k.npy"), "<f4", (T, H, D), [0.25] * (T * H * D))
    npy_min.write(os.path.join(d, "v.npy"), "<f4", (T, H, D), [1.0] * (T * H * D))
    npy_min.write(os.path.join(d, "cu_seqlens.npy"), "<i4", (len(cu),), list(cu))
    return d


# Class 1.
sparse(os.path.join(load_dir("magic"), "q.npy"), b"PK\x03\x04 this is a zip, not an .npy file", 3 * GIB)
more = header_bytes(dict_for("<f4", (1 << 20, 8, 64)))  # promises 2 GiB of data
sparse(os.path.join(load_dir("promise_more"), "q.npy"), more, len(more) + 16)
with open(os.path.join(root, "promise_more", "q.npy"), "rb") as f:
    assert f.read(6) == b"\x93NUMPY"
good = header_bytes(dict_for("<f4", (T, H, D)))
sparse(os.path.join(load_dir("promise_less"), "q.npy"), good, len(good) + T * H * D * 4 + GIB)
huge = 10 << 20
sparse(os.path.join(load_dir("huge_header"), "q.npy"), b"\x93NUMPY\x02\x00" + struct.pack("<I", huge) + b"{'descr': ",
       12 + huge)
# 10^7 zero-length sequences then one of T tokens: int64 zeros (a hole) and T at the end.
zero = load_dir("zero_sequences")
count = 10**7 + 1
head = header_bytes(dict_for("<i8", (count,)))
cu_path = os.path.join(zero, "cu_seqlens.npy")
sparse(cu_path, head, len(head) + 8 * count)
with open(cu_path, "r+b") as f:
    f.seek(len(head) + 8 * (count - 1))
    f.write(struct.pack("<q", T))
# 6 GiB of bf16 tensors (stored as uint16), one sequence.
big = os.path.join(root, "six_gib")
os.makedirs(big, exist_ok=True)
rows = 6 * GIB // (8 * 64 * 2 + 2 * 2 * 64 * 2)
for name, heads in (("q", 8), ("k", 2), ("v", 2)):
    head = header_bytes(dict_for("<u2", (rows, heads, 64)))
    sparse(os.path.join(big, name + ".npy"), head, len(head) + rows * heads * 64 * 2)
npy_min.write(os.path.join(big, "cu_seqlens.npy"), "<i8", (2,), [0, rows])
with open(os.path.join(root, "one_huge_document.txt"), "w") as f:
    f.write("2147483647\n")

# Class 6.
with open(os.path.join(load_dir("header_escape"), "q.npy"), "wb") as f:
    f.write(header_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (16" + ESC_TITLE + ", 2, 8), }"))
    f.write(b"\0" * (T * H * D * 4))
with open(os.path.join(load_dir("descr_escape"), "q.npy"), "wb") as f:
    f.write(header_bytes(dict_for("<f4" + ESC_TITLE, (T, H, D))))
    f.write(b"\0" * (T * H * D * 4))
with open(os.path.join(load_dir("key_escape"), "q.npy"), "wb") as f:
    f.write(header_bytes("{'descr': '<f4', 'fortran_order': False, '" + ESC_TITLE + "': 1, 'shape': (16, 2, 8), }"))
    f.write(b"\0" * (T * H * D * 4))
with open(os.path.join(root, "lengths_" + ESC_TITLE + ".txt"), "w") as f:
    f.write("100\n20000\n")
