#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): small valid and
near-valid inputs in each target's format. The files are checked in; run this again after
changing a format (fuzz_capi's program encoding mirrors capi_program.h and fuzz_capi.cpp):

    python3 tests/fuzz/make_seeds.py

`ctest -L fuzz` in a fuzz build runs every target once on each of its seeds, and
THDCP_FUZZ_TRACE=1 build-fuzz/tests/fuzz/<target> SEED prints what a seed does (the calls a
fuzz_capi program makes).
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
    write(t, "load_empty_offsets", load(0, base[:3] + [npy("<i8", (0,), b"")]))


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


# ---- fuzz_capi: programs of C ABI calls -----------------------------------------------------
# Encoders of capi_program.h's operands and fuzz_capi.cpp's operations (opcodes in Harness::step).

ATTN_CREATE, ATTN_DESTROY, ATTN_FORWARD, ATTN_BACKWARD, GROUP_CREATE, COMM_DESTROY, COMM_QUERY, \
    CP_CREATE, CP_DESTROY, CP_RUN, HELPERS, SPLIT_MERGE, LIBRARY, FOREIGN = range(14)
BF16, FP32 = 0, 2  # value_dtype bytes (1 is fp16, 250 THDCP_DTYPE_DEFAULT)


def i64(v):
    """value_i64: small values as one byte, others through the raw escapes."""
    if -16 <= v <= 207:
        return bytes([v + 16])
    specials = {-2**63: 0, 2**63 - 1: 1, 2**31 - 1: 2, 2**31: 3, -2**31: 4, 2**53: 5, 2**53 - 1: 6,
                2**62: 7, 2**63 - 4: 8, 2**32 - 1: 9, 1024: 10, 1025: 11, 4096: 12, 4097: 13, 65536: 14}
    if v in specials:
        return bytes([224 + specials[v]])
    if -2**15 <= v < 2**15:
        return bytes([240]) + struct.pack("<h", v)
    return bytes([241]) + struct.pack("<i", v)


def scale(index=0):
    return bytes([index])  # value_float: 0 -> 0 (1/sqrt(D)), 1 -> 0.125, 2 -> 1.0, 4 -> NaN


def struct_size(form=0, extra=b""):
    """ParamsBuffer: 0 sizeof, 6 the first version, 7 too small, 8 newer (+extra), 9 too large."""
    return bytes([form]) + extra


def attention_params(dtype=BF16, tokens=16, hq=2, hkv=1, d=8, seqs=4, left=-1, right=0, optional=None):
    out = bytes([0, dtype]) + i64(tokens) + i64(hq) + i64(hkv) + i64(d) + i64(seqs) + i64(left) + i64(right)
    out += scale()
    if optional is None:
        return out + b"\x00"
    deterministic, num_threads = optional
    return out + b"\x01" + bytes([deterministic, 1, 1]) + i64(num_threads)


def attn_create(slot, params, size=struct_size(), null_params=False, null_out=False):
    return bytes([ATTN_CREATE, slot]) + params + size + bytes([255 if null_params else 0, 255 if null_out else 0])


def layout(seqs, lengths, extra=None, raw=False, change=None, form=0):
    """decode_layout: num_seqs, then per sequence its length and whether it gets extra padding."""
    out = bytes([seqs - 1, 7 if raw else 0])
    for i in range(seqs):
        out += bytes([lengths[i], 0 if extra and extra[i] else 1])
    out += bytes([224 + change[0], change[1]]) + i64(change[2]) if change else b"\x00"
    return out + bytes([form])


HONEST = b"\x00\x00"  # decode_tensor: the tensor the call expects, its data given


def attn_run(op, slot, lay, align=1, fill=0, tensors=None):
    """attention_run's operands: q, k, v, out, the lse and max_logit bytes, then (backward)
    dout, dq, dk, dv."""
    t = list(tensors or [])
    t += [HONEST] * ((8 if op == ATTN_BACKWARD else 4) - len(t))
    return bytes([op, slot, align - 1]) + lay + bytes([fill]) + b"".join(t[:4]) + b"\x00\x00" + b"".join(t[4:])


def program_attention():
    p = attn_create(0, attention_params())
    lay = layout(3, [3, 5, 0], extra=[False, False, True])
    p += attn_run(ATTN_FORWARD, 0, lay, align=2)
    p += attn_run(ATTN_BACKWARD, 0, lay, align=2)
    p += bytes([ATTN_DESTROY, 0, ATTN_DESTROY, 0])  # a double destroy
    p += attn_run(ATTN_FORWARD, 0, lay, align=2)  # a use after destroy
    return p


def program_attention_fp32_window():
    p = attn_create(1, attention_params(dtype=FP32, tokens=24, hq=4, hkv=2, d=16, seqs=3, left=4, right=2,
                                        optional=(1, 1)), size=struct_size(6))
    p += attn_run(ATTN_FORWARD, 1, layout(2, [7, 9]), align=4)
    p += attn_run(ATTN_BACKWARD, 1, layout(2, [7, 9]), align=4)
    # One tensor that differs: q with 3 heads (tensor form 224 + 1: heads).
    p += attn_run(ATTN_FORWARD, 1, layout(1, [5]), align=1, tensors=[bytes([225]) + i64(3) + b"\x00"])
    return p


def program_struct_sizes():
    p = attn_create(0, attention_params(), size=struct_size(8, bytes([2, 0])))  # newer, zero tail
    p += attn_create(1, attention_params(), size=struct_size(8, bytes([2, 1, 3])))  # newer, a byte set
    p += attn_create(2, attention_params(), size=struct_size(9, bytes([1])))  # THDCP_MAX_STRUCT_SIZE, zeros
    p += attn_create(2, attention_params(), size=struct_size(9, bytes([0])))  # THDCP_MAX_STRUCT_SIZE + 8
    p += attn_create(3, attention_params(), size=struct_size(7, bytes([1])))  # 8 bytes: too small
    p += attn_create(3, attention_params(), size=struct_size(10, bytes([3])))  # not a multiple of 8
    p += attn_create(0, attention_params(), null_params=True)
    p += attn_create(0, attention_params(hq=3, hkv=2))  # GQA ratio refused
    p += attn_create(0, attention_params(d=12))  # head dim refused
    p += attn_create(0, attention_params(tokens=2**53))  # size refused
    return p


def cp_params(dtype=BF16, tokens=16, hq=2, hkv=2, d=8, seqs=4, left=-1, right=0, cp_byte=0, optional=None):
    out = bytes([0, dtype]) + i64(tokens) + i64(hq) + i64(hkv) + i64(d) + bytes([cp_byte])
    out += i64(seqs) + i64(left) + i64(right) + scale() + b"\x01"
    if optional is None:
        return out + b"\x00"
    return out + b"\x01" + i64(optional) + b"\x00\x00"


def cp_create(cp_set, group, params, ranks, odd=(7, 0), sizes=None):
    out = bytes([CP_CREATE, cp_set, group]) + params + bytes(odd)
    out += b"".join(sizes or [struct_size()] * ranks)
    return out + b"\x00"


def group_create(group, size):
    return bytes([GROUP_CREATE, group, size - 1, 0])


def cp_run(cp_set, backward, lay, ranks):
    return bytes([CP_RUN, 1 if backward else 0, cp_set]) + lay + HONEST * ((8 if backward else 4) * ranks)


def program_cp2():
    p = group_create(0, 2)
    p += cp_create(0, 0, cp_params(optional=1), 2)
    lay = layout(2, [5, 2])
    p += cp_run(0, False, lay, 2) + cp_run(0, True, lay, 2)
    p += bytes([COMM_DESTROY, 0, 0, COMM_DESTROY, 0, 1])  # the communicators first
    p += cp_run(0, False, lay, 2)  # the plans hold them
    p += bytes([CP_DESTROY, 0, 0, CP_DESTROY, 0, 1, CP_DESTROY, 0, 1])
    return p


def program_cp_disagree():
    p = group_create(1, 3)
    p += cp_create(1, 1, cp_params(tokens=24), 3, odd=(1, 1))  # rank 1 passes another head_dim
    p += cp_create(1, 1, cp_params(tokens=24), 3)  # the group was aborted by the failure
    p += group_create(1, 2)
    p += cp_create(2, 1, cp_params(tokens=8, hq=4, hkv=1, d=16, seqs=2, cp_byte=0), 2)
    p += cp_run(2, False, layout(1, [3]), 2)
    p += cp_run(2, True, layout(1, [3]), 2)
    return p


def program_communicators():
    p = group_create(0, 1)
    for which in range(6):
        p += bytes([COMM_QUERY, 0, 0, which, 0])
    p += bytes([COMM_QUERY, 0, 0, 0, 255])  # NULL output
    p += bytes([COMM_DESTROY, 0, 0, COMM_DESTROY, 0, 0, COMM_QUERY, 0, 0, 1, 0])
    p += cp_create(0, 0, cp_params(), 1)  # over a destroyed communicator
    p += bytes([GROUP_CREATE, 2, 240]) + i64(1025) + b"\x00"  # more than THDCP_MAX_GROUP_SIZE: refused
    p += bytes([GROUP_CREATE, 2, 240]) + i64(-2**31) + b"\x00"  # refused
    p += bytes([GROUP_CREATE, 2, 0, 255])  # NULL comms
    p += bytes([CP_CREATE, 1, 1]) + cp_params() + bytes([7, 0]) + struct_size() + b"\x00"  # no group
    return p


def lengths(values):
    out = bytes([len(values)])
    for v in values:
        out += bytes([v]) if 0 <= v < 50 else bytes([200]) + i64(v)
    return out


def helper(which, values, cp, operands=b""):
    return bytes([HELPERS, which]) + lengths(values) + bytes([cp - 1]) + operands


def program_helpers():
    docs = [5, 9, 30, 0]
    p = helper(0, docs, 2, b"\x00")  # padded_rows
    p += helper(1, docs, 2, b"\x00")  # make_layout
    p += helper(2, docs, 1, bytes([0, 16, 1, 0]))  # capacity_default(256, 2)
    p += helper(3, docs, 2, bytes([4, 3, 0]))  # check_fit against (64 tokens, 4 seqs)
    p += helper(3, docs, 2, bytes([4, 2, 0]))  # 3 documents, max_seqs 3: too many
    p += helper(4, docs, 2, bytes([4, 3, 0]))  # capacity_layout
    p += helper(5, docs, 1, bytes([3, 0, 1, 3, 0, 24]))  # choose_cp_size of 1,2,4 at 24 rows per rank
    p += helper(6, [5, 9, 30, 70], 1, bytes([0, 1, 0, 1, 1]) + struct_size() + b"\x00")  # plan_capacity, split
    p += helper(0, [2**63 - 4, 3], 1, b"\x00")  # within 2*cp of 2^63: refused
    p += helper(1, [2**31 - 1, 5], 1, b"\x00")  # offsets past int32
    p += helper(6, [100, 7], 2, bytes([0, 3, 0, 0, 2]) + struct_size() + bytes([224]))  # a larger result struct
    p += helper(6, [100, 7], 2, bytes([0, 3, 0, 0, 2]) + struct_size() + bytes([226]))  # its size not a multiple of 8
    return p


def split(cp, rank, lay, which, row_bytes=4, operands=b""):
    return bytes([SPLIT_MERGE, cp - 1, rank]) + lay + bytes([which, row_bytes - 1]) + operands


def program_split():
    lay = layout(2, [3, 6])
    p = split(2, 1, lay, 0, operands=b"\x00\x00")
    p += split(2, 0, lay, 1, operands=b"\x00\x00")  # split, buffers apart
    p += split(2, 1, lay, 2, operands=b"\x03\x00")  # merge, buffers adjacent
    p += split(2, 1, lay, 1, operands=b"\x02\x05")  # overlapping: refused
    p += split(3, 2, layout(1, [4]), 0, operands=b"\x05\x00")  # num_rows off by one
    p += split(2, 0, layout(2, [3, 6], raw=True), 1, operands=b"\x00\x00")  # raw offsets
    return p


def program_library_foreign():
    p = bytes([LIBRARY, 0, 3, 0, 1, 0, LIBRARY, 0, 9, 0, 7, 255])
    p += attn_create(0, attention_params()) + group_create(0, 1)
    for kind in range(4):
        for source in range(4):
            p += bytes([FOREIGN, kind, source, kind % 2, 0, 5])
    return p


def capi_seeds():
    t = "fuzz_capi"
    write(t, "attention", program_attention())
    write(t, "attention_fp32_window", program_attention_fp32_window())
    write(t, "struct_sizes", program_struct_sizes())
    write(t, "cp2", program_cp2())
    write(t, "cp_disagree", program_cp_disagree())
    write(t, "communicators", program_communicators())
    write(t, "helpers", program_helpers())
    write(t, "split", program_split())
    write(t, "library_foreign", program_library_foreign())


if __name__ == "__main__":
    npy_seeds()
    lengths_seeds()
    capi_seeds()
