"""Minimal .npy reader/writer in the Python standard library, so the CLI tests check
thdcp's files with code that shares nothing with thdcp (and need no NumPy)."""
import ast
import struct

_FORMATS = {"<f4": "f", "<f2": "e", "<i4": "i", "<i8": "q", "<u2": "H"}


def write(path, descr, shape, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (
        descr, "(%s)" % "".join("%d, " % s for s in shape) if len(shape) != 1 else "(%d,)" % shape[0])
    total = 10 + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%d%s" % (len(values), _FORMATS[descr]), *values))


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    major = data[6]
    if major == 1:
        length, start = struct.unpack("<H", data[8:10])[0], 10
    else:
        length, start = struct.unpack("<I", data[8:12])[0], 12
    header = ast.literal_eval(data[start:start + length].decode("latin1"))
    assert not header["fortran_order"]
    count = 1
    for s in header["shape"]:
        count *= s
    fmt = _FORMATS[header["descr"]]
    values = struct.unpack_from("<%d%s" % (count, fmt), data, start + length)
    return header["descr"], tuple(header["shape"]), list(values)
