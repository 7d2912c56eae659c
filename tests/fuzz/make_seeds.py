#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): small valid and
near-valid inputs in each target's format. The files are checked in; run this again after
changing a format:

    python3 tests/fuzz/make_seeds.py

`ctest -L fuzz` in a fuzz build runs every target once on each of its seeds, and
THDCP_FUZZ_TRACE=1 build-fuzz/tests/fuzz/<target> SEED prints what a seed does.
Needs only the Python standard library."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- fuzz_lengths: lengths and batches files ------------------------------------------------

def lengths_seeds():
    t = "fuzz_lengths"
    write(t, "lengths_simple.txt", "100\n2000\n17\n4096\n")
    write(t, "lengths_comments.txt", "# documents of one shard\n  12  \n\n+7 # a sign\r\n3\n")
    write(t, "lengths_knobs_split.txt", "#fuzz tokens=64 cp=1,2,4 long=split budget=0.05\n150\n3\n70\n")
    write(t, "lengths_knobs_truncate.txt", "#fuzz tokens=36 cp=2,3 long=truncate\n100\n1\n31\n")
    write(t, "lengths_knobs_error.txt", "#fuzz tokens=16 cp=8\n17\n")
    write(t, "lengths_max.txt", "2147483647\n")
    write(t, "lengths_bad_zero.txt", "5\n0\n")
    write(t, "lengths_bad_two_values.txt", "5 6\n")
    write(t, "lengths_bad_overflow.txt", "2147483648\n")
    write(t, "batches_simple.txt", "3 5 7\n100,200\n1\n")
    write(t, "batches_knobs.txt", "#fuzz tokens=256 cp=1,2,4,8 budget=0.5\n10, 20 30\n\t40\n# a comment\n")
    write(t, "batches_bad_commas.txt", "1,,2\n,3\n4,\n")
    with open(os.path.join(HERE, "..", "..", "data", "sample_lengths.txt")) as f:
        write(t, "lengths_sample_head.txt", "#fuzz tokens=16384 cp=1,2,4,8\n" + "".join(f.readlines()[:60]))


if __name__ == "__main__":
    lengths_seeds()
