// libFuzzer target: the CLI's .npy reader (tools/io/npy.h) and the --load path of
// `thdcp run` that reads a directory of them (tools/run/run_inputs.h).
//
// An input is either
//  - one .npy file: read_npy_header, read_npy, npy_to_int64, check_npy_shape, and for a file
//    that reads, write_npy of what was read and a second read of that; or
//  - "THDCPLOAD", a config byte, then the files of a --load directory separated by "@@npy@@":
//    q, k, v, cu_seqlens, cu_seqlens_padded, dout (a missing or empty optional one is left
//    out; a missing required one is absent). Config byte: bits 0-2 cp - 1, bit 3
//    --allow-nonfinite, bit 4 --dtype given, bits 5-6 that dtype (bf16, fp16, fp32, bf16),
//    bit 7 --heads 8:2 given. Then read_load_headers, load_size, load_layout, load_tensors,
//    in the order run_command.cpp calls them (without its memory check: an input's tensors
//    are at most 16 times its bytes, cp re-padding included).
//
// A call may succeed or throw thdcp::Error (UsageError is one); any other exception, a
// sanitizer report, or a result that breaks what the headers promise (FUZZ_CHECK: a header
// that claims other bytes than the file holds, data that differs from the file's) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "io/npy.h"
#include "run/run_inputs.h"
#include "fuzz_support.h"
#include "thdcp/core/error.h"

namespace {

using thdcp::fuzz::ScratchFiles;
using namespace thdcp::tools;

constexpr char kLoadMagic[] = "THDCPLOAD";
constexpr char kSeparator[] = "@@npy@@";
const char* const kLoadFiles[] = {"q.npy", "k.npy", "v.npy", "cu_seqlens.npy", "cu_seqlens_padded.npy", "dout.npy"};
constexpr int kRequiredFiles = 4;
// Files up to this size are written back and read again.
constexpr uint64_t kMaxRoundTripBytes = uint64_t{1} << 20;

bool starts_with(const uint8_t* data, size_t size, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return size >= n && std::memcmp(data, prefix, n) == 0;
}

// One .npy file.
void read_one(const uint8_t* data, size_t size) {
  const ScratchFiles& files = ScratchFiles::get();
  const std::string path = files.write("a.npy", data, size);
  NpyHeader header;
  try {
    header = read_npy_header(path);
  } catch (const thdcp::Error& e) {
    thdcp::fuzz::trace(std::string("read_npy_header: ") + e.what());
    return;
  }
  thdcp::fuzz::trace("read_npy_header: " + header.descr + " " + format_shape(header.shape));
  // What the header promises: the file is exactly magic, header and numel * itemsize bytes.
  const uint64_t numel = static_cast<uint64_t>(header.numel());
  FUZZ_CHECK(header.data_offset <= size && header.data_offset + header.data_bytes == size,
             "the header accounts for every byte of the file");
  FUZZ_CHECK(header.data_bytes == numel * npy_itemsize(header.descr), "data_bytes is numel * itemsize");
  (void)format_shape(header.shape);

  const NpyArray array = read_npy(path);
  FUZZ_CHECK(array.descr == header.descr && array.shape == header.shape && array.data_offset == header.data_offset,
             "read_npy reads the header read_npy_header read");
  FUZZ_CHECK(array.data.size() == header.data_bytes &&
                 (array.data.empty() || std::memcmp(array.data.data(), data + header.data_offset, array.data.size()) == 0),
             "read_npy's data are the file's bytes after the header");
  try {
    const std::vector<int64_t> values = npy_to_int64(array, "offsets");
    FUZZ_CHECK(values.size() == numel, "npy_to_int64 gives one value per element");
  } catch (const thdcp::Error&) {
    FUZZ_CHECK(array.descr != "<i4" && array.descr != "<i8", "npy_to_int64 refused an integer array");
  }
  for (const std::vector<int64_t>& expected :
       {std::vector<int64_t>{-1}, std::vector<int64_t>{-1, -1, -1}, std::vector<int64_t>{2, -1, 8}}) {
    try {
      check_npy_shape(header, expected, "the fuzzed array");
    } catch (const thdcp::Error&) {
    }
  }

  // Written back as thdcp writes arrays, it reads as the same array.
  if (header.data_bytes > kMaxRoundTripBytes) return;
  const std::string copy = files.path("copy.npy");
  write_npy(copy, array.descr, array.shape, array.data.data());
  const NpyArray again = read_npy(copy);
  FUZZ_CHECK(again.descr == array.descr && again.shape == array.shape && again.data == array.data,
             "write_npy then read_npy gives the array back");
}

// The files of a --load directory, split at the separators.
std::vector<std::string> load_sections(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sections;
  size_t begin = 0;
  while (sections.size() + 1 < std::size(kLoadFiles)) {
    const size_t at = body.find(kSeparator, begin);
    if (at == std::string::npos) break;
    sections.push_back(body.substr(begin, at - begin));
    begin = at + std::strlen(kSeparator);
  }
  sections.push_back(body.substr(begin));
  return sections;
}

// `thdcp run --load DIR` up to the run itself.
void load_directory(const uint8_t* data, size_t size) {
  const ScratchFiles& files = ScratchFiles::get();
  const size_t skip = std::strlen(kLoadMagic);
  const uint8_t config_byte = size > skip ? data[skip] : 0;
  const size_t body = std::min(size, skip + 1);
  const std::vector<std::string> sections = load_sections(data + body, size - body);
  for (size_t i = 0; i < std::size(kLoadFiles); ++i) {
    const bool optional = static_cast<int>(i) >= kRequiredFiles;
    if (i < sections.size() && !(optional && sections[i].empty())) {
      files.write(kLoadFiles[i], sections[i].data(), sections[i].size());
    } else {
      files.remove(kLoadFiles[i]);
    }
  }

  RunConfig config;
  config.load_dir = files.dir();
  config.cp = 1 + (config_byte & 7);
  config.allow_nonfinite = (config_byte & 8) != 0;
  const bool dtype_given = (config_byte & 16) != 0;
  const thdcp::DType dtypes[] = {thdcp::DType::kBFloat16, thdcp::DType::kFloat16, thdcp::DType::kFloat32,
                                 thdcp::DType::kBFloat16};
  if (dtype_given) config.dtype = dtypes[(config_byte >> 5) & 3];
  const bool heads_given = (config_byte & 128) != 0;
  if (heads_given) {
    config.q_heads = 8;
    config.kv_heads = 2;
  }
  try {
    const LoadFiles loaded = read_load_headers(config, dtype_given, heads_given, false);
    const RunSize promised = load_size(loaded);
    GlobalBatch batch = load_layout(config, loaded);
    const RunSize exact = load_size(loaded, batch);
    load_tensors(config, loaded, batch);

    const thdcp::LayoutView job = batch.layout.view();
    const thdcp::LayoutView user = batch.user_layout.view();
    const int64_t rows = job.total_rows();
    FUZZ_CHECK(exact.rows == rows && promised.loaded_rows == user.total_rows(), "load_size gives the layouts' rows");
    FUZZ_CHECK(static_cast<int64_t>(batch.lengths.size()) == job.num_seqs && job.num_seqs == user.num_seqs,
               "a length per sequence");
    for (int b = 0; b < job.num_seqs; ++b) {
      FUZZ_CHECK(job.padded_length(b) % (2 * config.cp) == 0, "the job's layout is aligned to 2*cp");
      FUZZ_CHECK(job.length(b) == user.length(b), "re-padding keeps the lengths");
    }
    for (const thdcp::HostTensor* t : {&batch.q, &batch.k, &batch.v, &batch.dout}) {
      FUZZ_CHECK(t->tokens() == rows && t->dtype() == config.dtype, "tensors in the job's layout and dtype");
    }
    FUZZ_CHECK(static_cast<int64_t>(batch.user_rows.size()) == rows, "a user row per job row");
    for (int32_t r : batch.user_rows) FUZZ_CHECK(r >= -1 && r < user.total_rows(), "user rows in range");
    thdcp::fuzz::trace("loaded: " + batch.source + ", " + std::to_string(rows) + " rows");
  } catch (const thdcp::Error& e) {
    thdcp::fuzz::trace(std::string("--load: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (starts_with(data, size, kLoadMagic)) {
    load_directory(data, size);
  } else {
    read_one(data, size);
  }
  return 0;
}
