// NumPy .npy files (format versions 1.0, 2.0 and 3.0; little-endian, C order), so that
// `thdcp run --load/--save` exchanges tensors with NumPy and PyTorch.
//
// Supported dtypes (NumPy `descr` strings):
//   "<f4" float32, "<f2" float16, "<u2" raw 16-bit words (bfloat16: NumPy has no bfloat16,
//   so the caller stores its bits as uint16 and names the dtype separately), "<i4" int32,
//   "<i8" int64.
// The host must be little-endian (x86-64, AArch64): data bytes are copied as they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thdcp::tools {

// The largest .npy header thdcp reads: NumPy writes a few hundred bytes (its own np.load
// refuses more than 10000 by default); a larger one is refused before it is read.
constexpr size_t kMaxNpyHeaderBytes = size_t{64} << 10;

// What an .npy file's header says and where its data lies, checked against the file's size
// before a byte of the data is read.
struct NpyHeader {
  std::string path;            // file it was read from (for messages); empty if built in memory
  std::string descr;           // one of the supported dtypes above
  std::vector<int64_t> shape;  // C order; empty for a 0-d array (one element)
  uint64_t data_offset = 0;    // bytes before the data: magic, version, header length, header
  uint64_t data_bytes = 0;     // numel() * itemsize: the rest of the file, exactly

  int64_t numel() const;
};

struct NpyArray : NpyHeader {
  std::vector<unsigned char> data;  // numel() * itemsize bytes, little-endian, C order
};

// Bytes per element of a supported descr; throws thdcp::Error naming the descr otherwise.
size_t npy_itemsize(const std::string& descr);

// Reads and checks only the header of an .npy file: at most the 12 bytes of magic, version
// and header length, then the header itself (at most kMaxNpyHeaderBytes). Throws thdcp::Error
// naming the file, what is wrong and what to change: missing/unreadable or special file, bad
// magic (not an .npy file), unsupported version, a header too long or malformed, big-endian
// or unsupported dtype, Fortran order (for ndim >= 2), or a file size that differs from what
// the header promises (truncated data, or bytes after it, e.g. several arrays in one file).
// Values from the file appear in messages as quote_excerpt excerpts.
NpyHeader read_npy_header(const std::string& path);

// Reads the data `header` describes into `data` (header.data_bytes bytes). Throws
// thdcp::Error if the file no longer holds them (changed since its header was read).
void read_npy_data(const NpyHeader& header, void* data);

// read_npy_header, then the data into memory.
NpyArray read_npy(const std::string& path);

// Writes `data` (numel(shape) * npy_itemsize(descr) bytes, C order, little-endian) as a .npy
// file: format 1.0, or 2.0 when the header needs more than 65535 bytes. The file is written
// to `path`.tmp and renamed, so a failure never leaves a half-written `path`.
//   path   destination file (its directory must exist)
//   descr  a supported dtype ("<f4", "<f2", "<u2", "<i4", "<i8")
//   shape  dimensions, each >= 0; empty for a 0-d array
//   data   the elements; may be null only when the array has no elements
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data);

// The header dictionary write_npy puts in a file, padded and terminated as NumPy does
// (exposed for tests).
std::string npy_header_dict(const std::string& descr, const std::vector<int64_t>& shape);

// Values of an integer array ("<i4" or "<i8") as int64. `name` (e.g. "cu_seqlens") is used in
// the message when the dtype is not an integer one.
std::vector<int64_t> npy_to_int64(const NpyArray& array, const std::string& name);

// Checks the array's shape. `expected` has one entry per dimension; -1 accepts any extent.
// The message names the file, the shape found and the shape expected, e.g.
//   "q.npy: shape (10, 8, 64) does not match (12, any, 64) expected for q ([T, H, D])"
//   what  describes the array and its expected layout, e.g. "q ([T, H, D])"
void check_npy_shape(const NpyHeader& array, const std::vector<int64_t>& expected, const std::string& what);

// "(2, 3)" / "(5,)" / "()" as NumPy prints shapes; -1 prints as "any".
std::string format_shape(const std::vector<int64_t>& shape);

}  // namespace thdcp::tools
