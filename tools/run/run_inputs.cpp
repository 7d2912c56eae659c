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
#include "io/npy.h"
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

// Random tensors for a layout the job runs on, seeded from the config.
GlobalBatch random_batch(const RunConfig& c, std::vector<int64_t> lengths, std::string source) {
  GlobalBatch batch;
  batch.source = std::move(source);
  batch.lengths = std::move(lengths);
  batch.layout = make_layout(batch.lengths, c.cp);
  const int64_t rows = batch.layout.total_rows();
  batch.q = HostTensor(c.dtype, rows, c.q_heads, c.head_dim);
  batch.k = HostTensor(c.dtype, rows, c.kv_heads, c.head_dim);
  batch.v = HostTensor(c.dtype, rows, c.kv_heads, c.head_dim);
  batch.dout = HostTensor(c.dtype, rows, c.q_heads, c.head_dim);
  fill_normal(batch.q, c.seed + 1);
  fill_normal(batch.k, c.seed + 2);
  fill_normal(batch.v, c.seed + 3);
  fill_normal(batch.dout, c.seed + 4);
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

// The storage dtype of a float array and --dtype: "<u2" holds raw 16-bit words whose meaning
// --dtype gives (bf16 unless it says fp16).
DType dtype_of(const NpyArray& a, const RunConfig& c, bool dtype_given) {
  DType d;
  if (a.descr == "<f4") {
    d = DType::kFloat32;
  } else if (a.descr == "<f2") {
    d = DType::kFloat16;
  } else if (a.descr == "<u2") {
    d = dtype_given ? c.dtype : DType::kBFloat16;
    if (d == DType::kFloat32) {
      throw UsageError(a.path + " holds 16-bit words (<u2) but --dtype is fp32: use --dtype bf16 (or fp16)");
    }
  } else {
    throw UsageError(a.path + ": dtype " + a.descr + " is not a tensor dtype: use float32 (<f4), float16 (<f2) or "
                     "bfloat16 stored as uint16 (<u2)");
  }
  if (dtype_given && d != c.dtype) {
    throw UsageError(a.path + " holds " + dtype_name(d) + " but --dtype is " + dtype_name(c.dtype) +
                     ": drop --dtype or convert the file");
  }
  return d;
}

HostTensor tensor_from(const NpyArray& a, DType dtype) {
  HostTensor t(dtype, a.shape[0], a.shape[1], a.shape[2]);
  std::memcpy(t.data(), a.data.data(), a.data.size());
  return t;
}

// Copies the valid rows of every sequence from `from` (layout `src`) to `to` (layout `dst`).
void copy_valid_rows(const HostTensor& from, const LayoutView& src, HostTensor& to, const LayoutView& dst) {
  const size_t row_bytes = from.row_bytes();
  for (int b = 0; b < src.num_seqs; ++b) {
    std::memcpy(static_cast<char*>(to.data()) + dst.padded_start(b) * row_bytes,
                static_cast<const char*>(from.data()) + src.padded_start(b) * row_bytes,
                static_cast<size_t>(src.length(b)) * row_bytes);
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
          throw UsageError(path + ": element [" + std::to_string(r) + ", " + std::to_string(i / t.head_dim()) + ", " +
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
  throw UsageError(a_path + " and " + b_path + text + " (--allow-nonfinite runs anyway)");
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
  const DocumentBatches batches = pack_documents(documents, c.tokens, 2 * static_cast<int64_t>(c.cp));
  const int64_t count = static_cast<int64_t>(batches.batches.size());
  if (c.batch_index >= count) {
    throw UsageError("--batch " + std::to_string(c.batch_index) + ": " + c.lengths_file + " packs into " +
                     std::to_string(count) + " batches of " + std::to_string(c.tokens) +
                     " rows: pick one of 0.." + std::to_string(count - 1));
  }
  return random_batch(c, batches.batches[static_cast<size_t>(c.batch_index)],
                      c.lengths_file + ", batch " + std::to_string(c.batch_index) + " of " + std::to_string(count));
}

namespace {

// q.npy, k.npy, v.npy and cu_seqlens.npy of --load, their shapes checked.
struct LoadedArrays {
  NpyArray q, k, v, cu;
};

LoadedArrays read_arrays(const std::string& dir) {
  LoadedArrays a{read_npy(join(dir, "q.npy")), read_npy(join(dir, "k.npy")), read_npy(join(dir, "v.npy")),
                 read_npy(join(dir, "cu_seqlens.npy"))};
  check_npy_shape(a.q, {-1, -1, -1}, "q ([T, Hq, D])");
  const int64_t rows = a.q.shape[0], q_heads = a.q.shape[1], head_dim = a.q.shape[2];
  // Zero-size tensors: nothing to attend to, and nothing a run could check.
  if (rows == 0) throw UsageError(a.q.path + ": T = 0 rows: a batch needs at least one token");
  if (q_heads == 0) throw UsageError(a.q.path + ": 0 heads: q needs at least one head");
  if (head_dim == 0) throw UsageError(a.q.path + ": head dim 0: use a multiple of 8 in [8, 256]");
  if (a.k.shape.size() == 3 && a.k.shape[1] == 0) throw UsageError(a.k.path + ": 0 heads: k and v need at least one head");
  check_npy_shape(a.k, {rows, -1, head_dim}, "k ([T, Hkv, D], T and D of q)");
  check_npy_shape(a.v, a.k.shape, "v (the shape of k)");
  check_npy_shape(a.cu, {-1}, "cu_seqlens ([num_seqs + 1])");
  return a;
}

// The run's heads, head dim and dtype from the loaded arrays; a flag that disagrees with them
// is refused.
void take_shape(RunConfig& c, const LoadedArrays& a, bool dtype_given, bool heads_given, bool head_dim_given) {
  const int64_t q_heads = a.q.shape[1], kv_heads = a.k.shape[1], head_dim = a.q.shape[2];
  const DType dtype = dtype_of(a.q, c, dtype_given);
  for (const NpyArray* x : {&a.k, &a.v}) {
    if (x->descr != a.q.descr) throw UsageError(x->path + " has dtype " + x->descr + " but q.npy has " + a.q.descr);
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
    throw UsageError(a.q.path + " has " + std::to_string(q_heads) + " heads, not a multiple of the " +
                     std::to_string(kv_heads) + " heads of " + a.k.path + " (GQA/MQA need Hq % Hkv == 0)");
  }
  if (!cpu_supports_head_dim(head_dim)) {
    throw UsageError(a.q.path + ": head dim " + std::to_string(head_dim) +
                     " is not supported: use a multiple of 8 in [8, 256]");
  }
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
}

// The user's layout: cu_seqlens with cu_seqlens_padded.npy when there is one, else with no
// padding (then the sequences must fill q's rows exactly).
BatchLayout user_layout_of(const std::string& dir, const NpyArray& cu, int64_t rows) {
  const std::vector<int64_t> cu_values = npy_to_int64(cu, "cu_seqlens");
  const std::string padded_path = join(dir, "cu_seqlens_padded.npy");
  if (file_exists(padded_path)) {
    const NpyArray cup = read_npy(padded_path);
    check_npy_shape(cup, cu.shape, "cu_seqlens_padded (the shape of cu_seqlens)");
    return layout_from_int64(cu_values, npy_to_int64(cup, "cu_seqlens_padded"));
  }
  if (!cu_values.empty() && cu_values.back() != rows) {
    throw UsageError(cu.path + ": its last entry is " + std::to_string(cu_values.back()) + " but q.npy has T=" +
                     std::to_string(rows) + " rows: without cu_seqlens_padded.npy the sequences must fill q exactly"
                     " (or add cu_seqlens_padded.npy)");
  }
  return layout_from_int64(cu_values, cu_values);
}

// dout.npy when there is one (its shape and dtype those of q), else N(0,1) values.
HostTensor load_dout(const std::string& dir, const LoadedArrays& a, const LayoutView& user, RunConfig& c) {
  const std::string dout_path = join(dir, "dout.npy");
  if (!file_exists(dout_path)) {
    HostTensor dout(c.dtype, a.q.shape[0], a.q.shape[1], a.q.shape[2]);
    fill_normal(dout, c.seed + 4);
    return dout;
  }
  const NpyArray dout = read_npy(dout_path);
  check_npy_shape(dout, a.q.shape, "dout (the shape of q)");
  if (dout.descr != a.q.descr) throw UsageError(dout.path + " has dtype " + dout.descr + " but q.npy has " + a.q.descr);
  HostTensor tensor = tensor_from(dout, c.dtype);
  if (!c.allow_nonfinite) {
    check_products(dout.path, check_finite(dout.path, tensor, user), a.v.path, c.loaded_max_v, c.head_dim);
  }
  return tensor;
}

// The batch in a layout the CP size can run: the user's when every padded length is already
// a multiple of 2*cp, else each sequence re-padded, remembering where every row came from.
void lay_out_for_cp(GlobalBatch& batch, const RunConfig& c, HostTensor q, HostTensor k, HostTensor v,
                    HostTensor dout) {
  const LayoutView user = batch.user_layout.view();
  bool aligned = true;
  for (int b = 0; b < user.num_seqs; ++b) aligned = aligned && user.padded_length(b) % (2 * c.cp) == 0;
  if (aligned) {
    batch.layout = batch.user_layout;
    batch.q = std::move(q);
    batch.k = std::move(k);
    batch.v = std::move(v);
    batch.dout = std::move(dout);
    batch.user_rows = identity_rows(user.total_rows());
    return;
  }
  batch.layout = make_layout(batch.lengths, c.cp);
  const LayoutView job = batch.layout.view();
  const int64_t job_rows = job.total_rows();
  for (auto [to, from] : {std::make_pair(&batch.q, &q), std::make_pair(&batch.k, &k), std::make_pair(&batch.v, &v),
                          std::make_pair(&batch.dout, &dout)}) {
    *to = HostTensor(from->dtype(), job_rows, from->heads(), from->head_dim());
    copy_valid_rows(*from, user, *to, job);
  }
  batch.user_rows.assign(static_cast<size_t>(job_rows), -1);
  for (int b = 0; b < job.num_seqs; ++b) {
    for (int64_t i = 0; i < job.length(b); ++i) {
      batch.user_rows[static_cast<size_t>(job.padded_start(b) + i)] = static_cast<int32_t>(user.padded_start(b) + i);
    }
  }
  batch.source += " (re-padded to multiples of 2*cp=" + std::to_string(2 * c.cp) + ")";
}

}  // namespace

GlobalBatch load_batch(RunConfig& c, bool dtype_given, bool heads_given, bool head_dim_given) {
  const std::string& dir = c.load_dir;
  const LoadedArrays a = read_arrays(dir);
  take_shape(c, a, dtype_given, heads_given, head_dim_given);
  const int64_t rows = a.q.shape[0];

  GlobalBatch batch;
  batch.source = "loaded from " + dir;
  batch.user_layout = user_layout_of(dir, a.cu, rows);
  const LayoutView user = batch.user_layout.view();
  validate_layout(user, rows, 0);
  for (int b = 0; b < user.num_seqs; ++b) batch.lengths.push_back(user.length(b));

  HostTensor q = tensor_from(a.q, c.dtype), k = tensor_from(a.k, c.dtype), v = tensor_from(a.v, c.dtype);
  // The valid rows must hold finite values whose products stay finite (padding rows are never
  // read, so anything goes there).
  if (!c.allow_nonfinite) {
    const double max_q = check_finite(a.q.path, q, user), max_k = check_finite(a.k.path, k, user);
    const double max_v = check_finite(a.v.path, v, user);
    check_products(a.q.path, max_q, a.k.path, max_k, c.head_dim);
    c.loaded_max_v = max_v;
  }
  HostTensor dout = load_dout(dir, a, user, c);
  lay_out_for_cp(batch, c, std::move(q), std::move(k), std::move(v), std::move(dout));
  return batch;
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
    throw Error("--save " + dir + ": cannot create the directory: " + std::strerror(errno));
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
