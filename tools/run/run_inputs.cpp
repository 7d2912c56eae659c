#include "run/run_inputs.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <numeric>

#include "io/args.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/planner.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

// Row r of the job's layout is row r of the user's.
std::vector<int32_t> identity_rows(int64_t rows) {
  std::vector<int32_t> user_rows(static_cast<size_t>(rows));
  std::iota(user_rows.begin(), user_rows.end(), 0);
  return user_rows;
}

// The layout the job runs `lengths` on: each document padded to a multiple of 2*cp (dual
// chunk), or the documents back to back and the buffer padded once to a multiple of cp
// (contiguous).
BatchLayout job_layout(const RunConfig& c, const std::vector<int64_t>& lengths) {
  return c.cp_layout == CpLayout::kDualChunk ? make_layout(lengths, c.cp) : make_contiguous_layout(lengths, c.cp);
}

// Random tensors for a layout the job runs on, seeded from the config.
GlobalBatch random_batch(const RunConfig& c, std::vector<int64_t> lengths, std::string source) {
  GlobalBatch batch;
  batch.source = std::move(source);
  batch.lengths = std::move(lengths);
  batch.layout = job_layout(c, batch.lengths);
  const int64_t rows = batch.layout.total_rows();
  batch.q = HostTensor(c.dtype, rows, c.q_heads, c.head_dim);
  batch.k = HostTensor(c.dtype, rows, c.kv_heads, c.head_dim);
  const int64_t v_head_dim = c.step_shape().value_head_dim();
  batch.v = HostTensor(c.dtype, rows, c.kv_heads, v_head_dim);
  batch.dout = HostTensor(c.dtype, rows, c.q_heads, v_head_dim);
  fill_normal(batch.q, c.seed + 1);
  fill_normal(batch.k, c.seed + 2);
  fill_normal(batch.v, c.seed + 3);
  fill_normal(batch.dout, c.seed + 4);
  if (c.sinks) {
    // Logits of the order of a row's scores, so that each sink takes a visible share.
    HostTensor sinks(DType::kFloat32, 1, c.q_heads, 1);
    fill_normal(sinks, c.seed + 5, 2.0f);
    for (int64_t h = 0; h < c.q_heads; ++h) batch.sinks.push_back(sinks.get(h));
  }
  batch.user_layout = batch.layout;
  batch.user_rows = identity_rows(rows);
  return batch;
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A path as messages quote it.
std::string quote_path(const std::string& path) { return quote_excerpt(path, kPathExcerptChars); }

// The storage dtype of a float array and --dtype: "<u2" holds raw 16-bit words whose meaning
// --dtype gives (bf16 unless it says fp16).
DType dtype_of(const NpyHeader& a, const RunConfig& c, bool dtype_given) {
  DType d;
  if (a.descr == "<f4") {
    d = DType::kFloat32;
  } else if (a.descr == "<f2") {
    d = DType::kFloat16;
  } else if (a.descr == "<u2") {
    d = dtype_given ? c.dtype : DType::kBFloat16;
    if (d == DType::kFloat32) {
      throw UsageError(quote_path(a.path) + " holds 16-bit words (<u2) but --dtype is fp32: use --dtype bf16 (or fp16)");
    }
  } else {
    throw UsageError(quote_path(a.path) + ": dtype " + quote_excerpt(a.descr) +
                     " is not a tensor dtype: use float32 (<f4), float16 (<f2) or bfloat16 stored as uint16 (<u2)");
  }
  if (dtype_given && d != c.dtype) {
    throw UsageError(quote_path(a.path) + " holds " + dtype_name(d) + " but --dtype is " + dtype_name(c.dtype) +
                     ": drop --dtype or convert the file");
  }
  return d;
}

// The [T, H, D] tensor of an .npy file, read straight into its storage.
HostTensor read_tensor(const NpyHeader& h, DType dtype) {
  HostTensor t(dtype, h.shape[0], h.shape[1], h.shape[2]);
  THDCP_CHECK(static_cast<uint64_t>(t.numel()) * dtype_size(dtype) == h.data_bytes,
              quote_path(h.path) << ": " << h.data_bytes << " data bytes do not hold " << dtype_name(dtype) << " elements");
  read_npy_data(h, t.data());
  return t;
}

// The offsets of an .npy file whose header was read (and sized the memory check): its data
// as that header describes it, as int64.
std::vector<int64_t> read_offsets(const NpyHeader& header, const std::string& name) {
  NpyArray array;
  static_cast<NpyHeader&>(array) = header;
  array.data.resize(header.data_bytes);
  read_npy_data(header, array.data.data());
  return npy_to_int64(array, name);
}

// Copies the valid rows of every sequence from `from` (layout `src`) to `to` (layout `dst`).
void copy_valid_rows(const HostTensor& from, const LayoutView& src, HostTensor& to, const LayoutView& dst) {
  const size_t row_bytes = from.row_bytes();
  for (int b = 0; b < src.num_seqs; ++b) {
    const size_t bytes = static_cast<size_t>(src.length(b)) * row_bytes;
    // Nothing to copy (an empty sequence, or rows of zero bytes): the tensors may hold no
    // memory at all, and memcpy's pointers must not be null even for zero bytes.
    if (bytes == 0) continue;
    std::memcpy(static_cast<char*>(to.data()) + dst.padded_start(b) * row_bytes,
                static_cast<const char*>(from.data()) + src.padded_start(b) * row_bytes, bytes);
  }
}

// The largest |value| in the valid rows of `t` (layout `layout`); throws UsageError naming the
// file, the element (row, head, dim) and the value at the first NaN or infinity.
double check_finite(const std::string& path, const HostTensor& t, const LayoutView& layout) {
  const int64_t per_row = t.heads() * t.head_dim();
  double largest = 0;
  for (int b = 0; b < layout.num_seqs; ++b) {
    for (int64_t r = layout.padded_start(b); r < layout.padded_start(b) + layout.length(b); ++r) {
      for (int64_t i = 0; i < per_row; ++i) {
        const float x = t.get(r * per_row + i);
        if (!std::isfinite(x)) {
          throw UsageError(quote_path(path) + ": element [" + std::to_string(r) + ", " + std::to_string(i / t.head_dim()) + ", " +
                           std::to_string(i % t.head_dim()) + "] (a valid row of sequence " + std::to_string(b) +
                           ") is " + (std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf") +
                           ": inputs must be finite (--allow-nonfinite runs anyway)");
        }
        largest = std::max(largest, static_cast<double>(std::fabs(x)));
      }
    }
  }
  return largest;
}

// Refuses inputs whose dot products over head_dim could overflow fp32 (q.k, dO.v).
void check_products(const std::string& a_path, double max_a, const std::string& b_path, double max_b,
                    int64_t head_dim) {
  const double bound = static_cast<double>(std::numeric_limits<float>::max()) / 4;
  if (max_a * max_b * static_cast<double>(head_dim) <= bound) return;
  char text[160];
  std::snprintf(text, sizeof(text), ": values up to %.3g and %.3g: their dot products over head dim %lld can overflow fp32",
                max_a, max_b, static_cast<long long>(head_dim));
  throw UsageError(quote_path(a_path) + " and " + quote_path(b_path) + text + " (--allow-nonfinite runs anyway)");
}

std::string descr_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "<u2";
  }
  return "<u2";
}

}  // namespace

GlobalBatch make_default_batch(const RunConfig& c) {
  return random_batch(c, sample_lengths(c.tokens, c.cp, LengthDistribution{}, c.seed),
                      "built-in: lognormal lengths (median 1500, sigma 1, max 16384)");
}

GlobalBatch make_batch_from_lengths(const RunConfig& c) {
  const DocumentLengths documents = read_lengths_file(c.lengths_file);
  // Only the batch asked for is built (a file of many short documents packs into many).
  int64_t count = 0;
  std::vector<int64_t> lengths =
      packed_batch(documents, c.tokens, c.cp_layout == CpLayout::kDualChunk ? c.row_multiple() : 1, c.batch_index,
                   &count);
  if (c.batch_index >= count) {
    throw UsageError("--batch " + std::to_string(c.batch_index) + ": " + quote_path(c.lengths_file) + " packs into " +
                     std::to_string(count) + " batches of " + std::to_string(c.tokens) +
                     " rows: pick one of 0.." + std::to_string(count - 1));
  }
  return random_batch(c, std::move(lengths),
                      quote_path(c.lengths_file) + ", batch " + std::to_string(c.batch_index) + " of " +
                          std::to_string(count));
}

LoadFiles read_load_headers(RunConfig& c, bool dtype_given, bool heads_given, bool head_dim_given) {
  const std::string& dir = c.load_dir;
  LoadFiles f{read_npy_header(join(dir, "q.npy")), read_npy_header(join(dir, "k.npy")),
              read_npy_header(join(dir, "v.npy")), read_npy_header(join(dir, "cu_seqlens.npy")), {}, {}};
  if (file_exists(join(dir, "cu_seqlens_padded.npy"))) f.cu_padded = read_npy_header(join(dir, "cu_seqlens_padded.npy"));
  if (file_exists(join(dir, "dout.npy"))) f.dout = read_npy_header(join(dir, "dout.npy"));
  check_npy_shape(f.q, {-1, -1, -1}, "q ([T, Hq, D])");
  const int64_t rows = f.q.shape[0], q_heads = f.q.shape[1], head_dim = f.q.shape[2];
  // Zero-size tensors: nothing to attend to, and nothing a run could check.
  if (rows == 0) throw UsageError(quote_path(f.q.path) + ": T = 0 rows: a batch needs at least one token");
  if (q_heads == 0) throw UsageError(quote_path(f.q.path) + ": 0 heads: q needs at least one head");
  if (head_dim == 0) throw UsageError(quote_path(f.q.path) + ": head dim 0: use a multiple of 8 in [8, 256]");
  if (f.k.shape.size() == 3 && f.k.shape[1] == 0) {
    throw UsageError(quote_path(f.k.path) + ": 0 heads: k and v need at least one head");
  }
  check_npy_shape(f.k, {rows, -1, head_dim}, "k ([T, Hkv, D], T and D of q)");
  check_npy_shape(f.v, f.k.shape, "v (the shape of k)");
  check_npy_shape(f.cu, {-1}, "cu_seqlens ([num_seqs + 1])");
  if (f.cu_padded) check_npy_shape(*f.cu_padded, f.cu.shape, "cu_seqlens_padded (the shape of cu_seqlens)");
  for (const NpyHeader* offsets : {&f.cu, f.cu_padded ? &*f.cu_padded : nullptr}) {
    if (offsets && offsets->descr != "<i4" && offsets->descr != "<i8") {
      throw UsageError(quote_path(offsets->path) + ": dtype " + quote_excerpt(offsets->descr) +
                       " is not an integer dtype: save the offsets as int32 (<i4) or int64 (<i8)");
    }
  }
  if (f.dout) {
    check_npy_shape(*f.dout, f.q.shape, "dout (the shape of q)");
    if (f.dout->descr != f.q.descr) {
      throw UsageError(quote_path(f.dout->path) + " has dtype " + quote_excerpt(f.dout->descr) + " but q.npy has " +
                       quote_excerpt(f.q.descr));
    }
  }

  // The run's heads, head dim and dtype from the headers; a flag that disagrees is refused.
  const int64_t kv_heads = f.k.shape[1];
  const DType dtype = dtype_of(f.q, c, dtype_given);
  for (const NpyHeader* x : {&f.k, &f.v}) {
    if (x->descr != f.q.descr) {
      throw UsageError(quote_path(x->path) + " has dtype " + quote_excerpt(x->descr) + " but q.npy has " +
                       quote_excerpt(f.q.descr));
    }
  }
  if (heads_given && (c.q_heads != q_heads || c.kv_heads != kv_heads)) {
    throw UsageError("--heads " + std::to_string(c.q_heads) + ":" + std::to_string(c.kv_heads) +
                     " disagrees with the loaded q/k (" + std::to_string(q_heads) + ":" + std::to_string(kv_heads) +
                     " heads): drop --heads");
  }
  if (head_dim_given && c.head_dim != head_dim) {
    throw UsageError("--head-dim " + std::to_string(c.head_dim) + " disagrees with the loaded head dim " +
                     std::to_string(head_dim) + ": drop --head-dim");
  }
  if (kv_heads < 1 || q_heads % kv_heads != 0) {
    throw UsageError(quote_path(f.q.path) + " has " + std::to_string(q_heads) + " heads, not a multiple of the " +
                     std::to_string(kv_heads) + " heads of " + quote_path(f.k.path) + " (GQA/MQA need Hq % Hkv == 0)");
  }
  if (!cpu_supports_head_dim(head_dim)) {
    throw UsageError(quote_path(f.q.path) + ": head dim " + std::to_string(head_dim) +
                     " is not supported: use a multiple of 8 in [8, 256]");
  }
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  return f;
}

RunSize load_size(const LoadFiles& f) {
  RunSize size;
  size.rows = f.q.shape[0];  // re-padding for cp may add rows: load_size(files, batch) knows
  size.sequences = std::max<int64_t>(0, f.cu.shape[0] - 1);
  size.loaded_rows = f.q.shape[0];
  size.offsets = f.cu.shape[0] * (f.cu_padded ? 2 : 1);
  return size;
}

RunSize load_size(const LoadFiles& f, const GlobalBatch& batch) {
  RunSize size = load_size(f);
  size.rows = batch.layout.total_rows();
  size.sequences = batch.layout.num_seqs();
  // Read straight into the job's tensors when the layout needs no re-padding.
  if (batch.layout.cu_seqlens_padded == batch.user_layout.cu_seqlens_padded) size.loaded_rows = 0;
  return size;
}

GlobalBatch load_layout(const RunConfig& c, const LoadFiles& f) {
  const int64_t rows = f.q.shape[0];
  GlobalBatch batch;
  batch.source = "loaded from " + quote_path(c.load_dir);
  // The user's layout: cu_seqlens with cu_seqlens_padded.npy when there is one, else with no
  // padding (then the sequences must fill q's rows exactly).
  const std::vector<int64_t> cu = read_offsets(f.cu, "cu_seqlens");
  if (f.cu_padded) {
    batch.user_layout = layout_from_int64(cu, read_offsets(*f.cu_padded, "cu_seqlens_padded"));
  } else {
    if (!cu.empty() && cu.back() != rows) {
      throw UsageError(quote_path(f.cu.path) + ": its last entry is " + std::to_string(cu.back()) + " but q.npy has T=" +
                       std::to_string(rows) + " rows: without cu_seqlens_padded.npy the sequences must fill q exactly"
                       " (or add cu_seqlens_padded.npy)");
    }
    batch.user_layout = layout_from_int64(cu, cu);
  }
  const LayoutView user = batch.user_layout.view();
  validate_layout(user, rows, 0);
  batch.lengths.reserve(static_cast<size_t>(user.num_seqs));
  for (int b = 0; b < user.num_seqs; ++b) batch.lengths.push_back(user.length(b));

  // The layout the CP size can run: the user's when every padded length is already a
  // multiple of 2*cp (dual chunk; contiguous: when its rows are a multiple of cp), else each
  // sequence re-padded, remembering where every row came from.
  bool aligned = c.cp_layout == CpLayout::kDualChunk || user.total_rows() % c.cp == 0;
  for (int b = 0; b < user.num_seqs && c.cp_layout == CpLayout::kDualChunk; ++b) {
    aligned = aligned && user.padded_length(b) % (2 * c.cp) == 0;
  }
  if (aligned) {
    batch.layout = batch.user_layout;
    batch.user_rows = identity_rows(user.total_rows());
    return batch;
  }
  batch.layout = job_layout(c, batch.lengths);
  const LayoutView job = batch.layout.view();
  batch.user_rows.assign(static_cast<size_t>(job.total_rows()), -1);
  for (int b = 0; b < job.num_seqs; ++b) {
    for (int64_t i = 0; i < job.length(b); ++i) {
      batch.user_rows[static_cast<size_t>(job.padded_start(b) + i)] = static_cast<int32_t>(user.padded_start(b) + i);
    }
  }
  batch.source += c.cp_layout == CpLayout::kDualChunk
                      ? " (re-padded to multiples of 2*cp=" + std::to_string(2 * c.cp) + ")"
                      : " (packed back to back, padded to a multiple of cp=" + std::to_string(c.cp) + ")";
  return batch;
}

void load_tensors(RunConfig& c, const LoadFiles& f, GlobalBatch& batch) {
  const LayoutView user = batch.user_layout.view();
  const bool repadded = batch.layout.cu_seqlens_padded != batch.user_layout.cu_seqlens_padded;
  // One file at a time: its tensor in the files' layout lives only until its valid rows are
  // in the job's layout.
  const auto place = [&](HostTensor tensor, HostTensor& into) {
    if (!repadded) {
      into = std::move(tensor);
      return;
    }
    into = HostTensor(tensor.dtype(), batch.layout.total_rows(), tensor.heads(), tensor.head_dim());
    copy_valid_rows(tensor, user, into, batch.layout.view());
  };
  // The valid rows must hold finite values whose products stay finite (padding rows are never
  // read, so anything goes there).
  const auto largest = [&](const std::string& path, const HostTensor& t) {
    return c.allow_nonfinite ? 0.0 : check_finite(path, t, user);
  };
  double max_q = 0, max_k = 0, max_v = 0, max_dout = 0;
  {
    HostTensor q = read_tensor(f.q, c.dtype);
    max_q = largest(f.q.path, q);
    place(std::move(q), batch.q);
  }
  {
    HostTensor k = read_tensor(f.k, c.dtype);
    max_k = largest(f.k.path, k);
    place(std::move(k), batch.k);
  }
  {
    HostTensor v = read_tensor(f.v, c.dtype);
    max_v = largest(f.v.path, v);
    place(std::move(v), batch.v);
  }
  if (!c.allow_nonfinite) check_products(f.q.path, max_q, f.k.path, max_k, c.head_dim);
  c.loaded_max_v = max_v;
  if (f.dout) {
    HostTensor dout = read_tensor(*f.dout, c.dtype);
    max_dout = largest(f.dout->path, dout);
    place(std::move(dout), batch.dout);
    if (!c.allow_nonfinite) check_products(f.dout->path, max_dout, f.v.path, max_v, c.head_dim);
  } else {
    // N(0,1) values in the files' layout, as if dout.npy had held them.
    HostTensor dout(c.dtype, f.q.shape[0], f.q.shape[1], f.q.shape[2]);
    fill_normal(dout, c.seed + 4);
    place(std::move(dout), batch.dout);
  }
}

HostTensor to_user_layout(const GlobalBatch& batch, const HostTensor& tensor) {
  HostTensor user(tensor.dtype(), batch.user_layout.total_rows(), tensor.heads(), tensor.head_dim());
  const size_t row_bytes = tensor.row_bytes();
  for (size_t r = 0; r < batch.user_rows.size(); ++r) {
    if (batch.user_rows[r] < 0) continue;
    std::memcpy(static_cast<char*>(user.data()) + batch.user_rows[r] * row_bytes,
                static_cast<const char*>(tensor.data()) + r * row_bytes, row_bytes);
  }
  return user;
}

std::vector<float> lse_to_user_layout(const GlobalBatch& batch, const std::vector<float>& lse, int64_t heads) {
  const int64_t job_rows = batch.layout.total_rows(), user_rows = batch.user_layout.total_rows();
  // Rows that hold no query (padding) have lse = -inf, as the kernels write them.
  std::vector<float> user(static_cast<size_t>(heads * user_rows), -INFINITY);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < job_rows; ++r) {
      const int32_t u = batch.user_rows[static_cast<size_t>(r)];
      if (u >= 0) user[static_cast<size_t>(h * user_rows + u)] = lse[static_cast<size_t>(h * job_rows + r)];
    }
  }
  return user;
}

const std::vector<std::string>& saved_file_names() {
  static const std::vector<std::string> names = {"q.npy",   "k.npy",  "v.npy",  "dout.npy", "cu_seqlens.npy",
                                                 "cu_seqlens_padded.npy", "out.npy", "dq.npy", "dk.npy",
                                                 "dv.npy",  "lse.npy", "max_logit.npy"};
  return names;
}

void save_run(const std::string& dir, const GlobalBatch& batch, const GlobalOutputs& outputs) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    throw Error("--save " + quote_path(dir) + ": cannot create the directory: " + std::strerror(errno));
  }
  const int64_t heads = outputs.out.heads();
  const int64_t rows = batch.user_layout.total_rows();
  auto save_tensor = [&](const char* name, const HostTensor& t) {
    write_npy(join(dir, name), descr_of(t.dtype()), {t.tokens(), t.heads(), t.head_dim()}, t.data());
  };
  auto save_offsets = [&](const char* name, const std::vector<int32_t>& offsets) {
    write_npy(join(dir, name), "<i4", {static_cast<int64_t>(offsets.size())}, offsets.data());
  };
  save_tensor("q.npy", to_user_layout(batch, batch.q));
  save_tensor("k.npy", to_user_layout(batch, batch.k));
  save_tensor("v.npy", to_user_layout(batch, batch.v));
  save_tensor("dout.npy", to_user_layout(batch, batch.dout));
  save_offsets("cu_seqlens.npy", batch.user_layout.cu_seqlens);
  save_offsets("cu_seqlens_padded.npy", batch.user_layout.cu_seqlens_padded);
  save_tensor("out.npy", to_user_layout(batch, outputs.out));
  save_tensor("dq.npy", to_user_layout(batch, outputs.dq));
  save_tensor("dk.npy", to_user_layout(batch, outputs.dk));
  save_tensor("dv.npy", to_user_layout(batch, outputs.dv));
  const std::vector<float> lse = lse_to_user_layout(batch, outputs.lse, heads);
  write_npy(join(dir, "lse.npy"), "<f4", {heads, rows}, lse.data());
  write_npy(join(dir, "max_logit.npy"), "<f4", {heads}, outputs.max_logit.data());
}

}  // namespace thdcp::tools
