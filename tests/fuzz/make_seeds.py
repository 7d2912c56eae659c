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


# ---- fuzz_npy: .npy files and --load directories -------------------------------------------

def npy(descr, shape, data=None, version=(1, 0), fortran=False, pad=True):
    shape_text = "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    length_bytes = 2 if version[0] == 1 else 4
    if pad:
        unpadded = 6 + 2 + length_bytes + len(header) + 1
        header += " " * ((64 - unpadded % 64) % 64)
    header += "\n"
    head = b"\x93NUMPY" + bytes(version)
    head += struct.pack("<H" if length_bytes == 2 else "<I", len(header))
    if data is None:
        count = 1
        for d in shape:
            count *= d
        size = {"<f4": 4, "<i4": 4, "<f2": 2, "<u2": 2, "<i8": 8}.get(descr, 4)
        data = bytes((i * 37 + 11) % 251 for i in range(count * size))
    return head + header.encode("latin-1") + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def bf16(values):
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def i32(values):
    return struct.pack("<%di" % len(values), *values)


def load(config, files):
    return b"THDCPLOAD" + bytes([config]) + b"@@npy@@".join(files)


def npy_seeds():
    t = "fuzz_npy"
    for descr in ("<f4", "<f2", "<u2", "<i4", "<i8"):
        write(t, "v1_%s_2x3.npy" % descr[1:], npy(descr, (2, 3)))
    write(t, "v2_f4_4.npy", npy("<f4", (4,), version=(2, 0)))
    write(t, "v3_i8_2x2x2.npy", npy("<i8", (2, 2, 2), version=(3, 0)))
    write(t, "v1_f4_scalar.npy", npy("<f4", ()))
    write(t, "v1_i4_empty.npy", npy("<i4", (0,)))
    write(t, "v1_f4_fortran_1d.npy", npy("<f4", (3,), fortran=True))
    write(t, "v1_unpadded.npy", npy("<i4", (2,), pad=False))
    # Near-valid: each breaks one rule the reader checks.
    write(t, "bad_fortran_2d.npy", npy("<f4", (2, 2), fortran=True))
    write(t, "bad_big_endian.npy", npy(">f4", (2,)))
    write(t, "bad_float64.npy", npy("<f8", (2,), data=bytes(16)))
    write(t, "bad_truncated.npy", npy("<f4", (4, 4))[:-5])
    write(t, "bad_trailing.npy", npy("<f4", (2,)) + b"\0\0\0\0")
    write(t, "bad_version.npy", npy("<f4", (2,), version=(4, 0)))
    write(t, "bad_header_length.npy", b"\x93NUMPY\x02\x00\xff\xff\xff\x7f{")
    write(t, "bad_magic.npy", b"PK\x03\x04" + npy("<f4", (2,))[4:])
    write(t, "bad_structured.npy", npy("[('a', '<f4')]", (2,), data=bytes(8)).replace(b"'[(", b"[(").replace(b")]'", b")]"))
    write(t, "bad_shape_overflow.npy", npy("<f4", (2**62, 2**62), data=b""))
    # --load directories: T=8 rows, 2 q heads, 1 kv head, D=8; cu_seqlens [0, 3, 8].
    t_rows, hq, hkv, d = 8, 2, 1, 8
    q = [((i * 7) % 13 - 6) / 8.0 for i in range(t_rows * hq * d)]
    kv = [((i * 5) % 11 - 5) / 8.0 for i in range(t_rows * hkv * d)]
    base = [npy("<u2", (t_rows, hq, d), bf16(q)), npy("<u2", (t_rows, hkv, d), bf16(kv)),
            npy("<u2", (t_rows, hkv, d), bf16(kv)), npy("<i4", (3,), i32([0, 3, 8]))]
    write(t, "load_bf16_cp1", load(0, base))
    write(t, "load_bf16_cp2_repad", load(1, base))  # lengths 3 and 5: not multiples of 4
    write(t, "load_padded_dout_cp4", load(3, base[:3] + [npy("<i4", (3,), i32([0, 2, 6])), npy("<i4", (3,), i32([0, 4, 8])),
                                                       npy("<u2", (t_rows, hq, d), bf16(q))]))
    write(t, "load_fp32", load(16 | (2 << 5), [npy("<f4", (t_rows, hq, d), f32(q)),
                                                npy("<f4", (t_rows, hkv, d), f32(kv)),
                                                npy("<f4", (t_rows, hkv, d), f32(kv)),
                                                npy("<i8", (3,), struct.pack("<3q", 0, 3, 8))]))
    nan = list(q)
    nan[5] = float("nan")
    write(t, "load_nan", load(0, [npy("<u2", (t_rows, hq, d), bf16(nan))] + base[1:]))
    write(t, "load_nan_allowed", load(8, [npy("<u2", (t_rows, hq, d), bf16(nan))] + base[1:]))
    write(t, "load_heads_flag", load(128, base))
    write(t, "load_missing_v", load(0, base[:2]))
    write(t, "load_bad_offsets", load(0, base[:3] + [npy("<i4", (3,), i32([0, 9, 8]))]))


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
    npy_seeds()
    lengths_seeds()
