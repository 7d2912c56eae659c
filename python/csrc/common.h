// Shared helpers of the PyTorch ops: tensor views, dtypes and error translation.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

#include "thdcp/core/error.h"
#include "thdcp/core/tensor.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/layout_balance.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/rope.h"

namespace thdcp::torch_ops {

// Runs `body`, turning a thdcp::Error into a Python exception by its kind: a bad argument
// (named with its value and the fix) a ValueError, a part the build lacks a
// NotImplementedError, anything else (CUDA, communication) a RuntimeError.
template <typename Body>
auto translate_errors(const char* op, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Error& e) {
    TORCH_CHECK_VALUE(e.kind() != ErrorKind::kInvalidArgument, "thdcp.", op, ": ", e.what());
    TORCH_CHECK_NOT_IMPLEMENTED(e.kind() != ErrorKind::kUnsupported, "thdcp.", op, ": ", e.what());
    TORCH_CHECK(false, "thdcp.", op, ": ", e.what());
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "thdcp.", op, ": ", e.what());
  }
}

inline DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kFloat: return DType::kFloat32;
    default:
      TORCH_CHECK_VALUE(false, "thdcp: ", name, " has dtype ", t.scalar_type(),
                        "; pass torch.bfloat16 or torch.float16 (float32 on the CPU backend)");
  }
}

// A [rows, heads, head_dim] tensor whose last dimension is contiguous: any row and head
// strides (views of a packed QKV buffer, head-major views x.transpose(0, 1) of [heads, rows,
// head_dim] memory, padded rows or heads) are passed on to the kernels with no copy; the
// backends check them against what they need (the CUDA one: 16-byte multiples).
inline void check_thd(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 3, "thdcp: ", name, " has ", t.dim(), " dimensions (shape ", t.sizes(),
                    "); pass a THD tensor [tokens, heads, head_dim]");
  TORCH_CHECK_VALUE(t.size(2) <= 1 || t.stride(2) == 1, "thdcp: ", name, " has stride ", t.stride(2),
                    " in head_dim (strides ", t.strides(), "); head_dim must be contiguous: pass ", name,
                    ".contiguous()");
  for (int dim = 0; dim < 2; ++dim) {
    TORCH_CHECK_VALUE(t.size(dim) <= 1 || t.stride(dim) != 0, "thdcp: ", name, " has stride 0 in dimension ", dim,
                      " of size ", t.size(dim), " (a broadcast, e.g. from expand); thdcp reads 0 as contiguous: pass ",
                      name, ".contiguous()");
  }
}

// t itself when thdcp can view it, else a contiguous copy: only a broadcast dimension
// (stride 0 over several rows or heads) is materialised, since thdcp's strides use 0 for
// "contiguous". For inputs, which are only read.
inline at::Tensor thd_input(const at::Tensor& t) {
  if (t.dim() == 3 && ((t.size(0) > 1 && t.stride(0) == 0) || (t.size(1) > 1 && t.stride(1) == 0))) {
    return t.contiguous();
  }
  return t;
}

// The strides of a checked THD tensor as thdcp takes them (elements): a dimension of one
// index never applies its stride, so it gets 0 (contiguous) whatever PyTorch reports.
inline int64_t thd_stride(const at::Tensor& t, int dim) { return t.size(dim) > 1 ? t.stride(dim) : 0; }

inline ConstThdTensor const_view(const at::Tensor& t, const char* name) {
  check_thd(t, name);
  return ConstThdTensor(t.data_ptr(), to_dtype(t, name), t.size(0), t.size(1), t.size(2), thd_stride(t, 0),
                        thd_stride(t, 1));
}

inline ThdTensor view(at::Tensor& t, const char* name) {
  check_thd(t, name);
  return ThdTensor(t.data_ptr(), to_dtype(t, name), t.size(0), t.size(1), t.size(2), thd_stride(t, 0),
                   thd_stride(t, 1));
}

// cu_seqlens-like metadata: int32, one dimension, at least two entries, contiguous, on `device`
// (the device of the tensor named `reference`).
inline void check_metadata(const at::Tensor& t, const char* name, const at::Device& device,
                           const char* reference = "q") {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt, "thdcp: ", name, " has dtype ", t.scalar_type(),
                    "; pass torch.int32 prefix sums");
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() >= 2, "thdcp: ", name, " has shape ", t.sizes(),
                    "; pass a 1-D tensor of num_seqs + 1 >= 2 prefix sums");
  TORCH_CHECK_VALUE(t.is_contiguous(), "thdcp: ", name, " is not contiguous; pass ", name, ".contiguous()");
  TORCH_CHECK_VALUE(t.device() == device, "thdcp: ", name, " is on ", t.device(), " but ", reference, " is on ",
                    device, "; move it to ", device);
}

// RoPE's optional per-sequence start offsets: int32, num_seqs entries, contiguous, on `device`.
inline void check_start_offsets(const std::optional<at::Tensor>& start_offsets, const at::Tensor& cu_seqlens,
                                const at::Device& device) {
  if (!start_offsets) return;
  TORCH_CHECK_VALUE(start_offsets->scalar_type() == at::kInt && start_offsets->is_contiguous() &&
                        start_offsets->numel() == cu_seqlens.numel() - 1 && start_offsets->device() == device,
                    "thdcp: start_offsets must be a contiguous int32 tensor of num_seqs = ", cu_seqlens.numel() - 1,
                    " entries on ", device);
}

// RoPE's arguments apart from x: cu_seqlens and cu_seqlens_padded (one entry per sequence +
// 1, on x's device), the optional start offsets, and rank in [0, cp).
inline void check_rope_arguments(const at::Tensor& x, const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                                 const std::optional<at::Tensor>& start_offsets, int64_t cp, int64_t rank) {
  const at::Device device = x.device();
  check_metadata(cu_seqlens, "cu_seqlens", device, "x");
  check_metadata(cu_seqlens_padded, "cu_seqlens_padded", device, "x");
  TORCH_CHECK_VALUE(cu_seqlens.numel() == cu_seqlens_padded.numel(), "thdcp: cu_seqlens has ", cu_seqlens.numel(),
                    " entries but cu_seqlens_padded has ", cu_seqlens_padded.numel());
  check_start_offsets(start_offsets, cu_seqlens, device);
  TORCH_CHECK_VALUE(cp >= 1 && cp <= 1024 && rank >= 0 && rank < cp, "thdcp: rope with cp=", cp, ", rank=", rank,
                    "; pass cp >= 1 and a rank in [0, cp)");
}

inline RopeConfig rope_config(double theta, int64_t rotary_dim, bool interleaved) {
  RopeConfig config;
  config.layout = interleaved ? RopeLayout::kInterleaved : RopeLayout::kHalfSplit;
  config.rotary_dim = rotary_dim;
  config.theta = static_cast<float>(theta);
  return config;
}

// A schema int (int64) as the C++ int the library takes: refused, never truncated, outside
// int32 (the Python doors check first, naming the Python argument; this guards direct
// torch.ops.thdcp calls).
inline int to_int(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value >= INT32_MIN && value <= INT32_MAX, "thdcp: ", name, "=", value,
                    " is out of range: pass an int in [", INT32_MIN, ", ", INT32_MAX, "]");
  return static_cast<int>(value);
}

inline void check_same_device(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK_VALUE(t.device() == device, "thdcp: ", name, " is on ", t.device(), " but q is on ", device,
                    "; pass every tensor on one device");
}

// The optional attention sinks of a call (one logit per query head): float32 [Hq], contiguous,
// on q's device. Their data, or null without sinks. q is a checked THD tensor.
inline const float* sinks_data(const std::optional<at::Tensor>& sinks, const at::Tensor& q) {
  if (!sinks) return nullptr;
  const int64_t heads = q.size(1);
  TORCH_CHECK_VALUE(sinks->scalar_type() == at::kFloat, "thdcp: sinks has dtype ", sinks->scalar_type(),
                    "; pass a torch.float32 tensor of one logit per query head (sinks.float())");
  TORCH_CHECK_VALUE(sinks->dim() == 1 && sinks->size(0) == heads, "thdcp: sinks has shape ", sinks->sizes(),
                    "; pass one logit per query head: shape [", heads, "] (q has ", heads, " heads)");
  TORCH_CHECK_VALUE(sinks->is_contiguous(), "thdcp: sinks is not contiguous; pass sinks.contiguous()");
  check_same_device(*sinks, "sinks", q.device());
  return sinks->data_ptr<float>();
}

// d(loss)/d(sinks) of a backward: float32 [Hq] with sinks, else [0] (the op returns a tensor
// either way).
inline at::Tensor dsinks_output(const std::optional<at::Tensor>& sinks, const at::Tensor& q) {
  return at::empty({sinks ? q.size(1) : 0}, q.options().dtype(at::kFloat));
}

// The CP layout a schema string names (cp_layout_name of one of kCpLayouts). The Python doors
// check it first, naming their own function; this guards direct torch.ops.thdcp calls.
inline CpLayout cp_layout_argument(const std::string& name) {
  std::string choices;
  for (const CpLayout layout : kCpLayouts) {
    if (name == cp_layout_name(layout)) return layout;
    choices += std::string(choices.empty() ? "'" : ", '") + cp_layout_name(layout) + "'";
  }
  TORCH_CHECK_VALUE(false, "thdcp: layout='", name, "' is not a CP layout: pass one of ", choices);
}

// The CP communication a schema string names, of those cp_attention's CUDA step runs.
inline cp::CpComm cp_comm_argument(const std::string& name) {
  if (name == "all_gather") return cp::CpComm::kAllGather;
  if (name == "all_to_all") return cp::CpComm::kAllToAll;
  if (name == "a2a+ag") return cp::CpComm::kA2aAg;
  TORCH_CHECK_VALUE(false, "thdcp: cp_comm='", name,
                    "' is not a CP communication: pass 'all_gather', 'all_to_all' or 'a2a+ag'");
}

// cp_attention's reduce_dtype: "fp32" (the default) or the tensors' "bf16" / "fp16" (the
// plan checks which).
inline DType reduce_dtype_argument(const std::string& name) {
  if (name == "fp32") return DType::kFloat32;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp16") return DType::kFloat16;
  TORCH_CHECK_VALUE(false, "thdcp: reduce_dtype='", name, "' is not a dtype: pass 'fp32', 'bf16' or 'fp16'");
}

inline Mask window_mask(int64_t left, int64_t right) {
  TORCH_CHECK_VALUE(left >= -1 && right >= -1 && left <= INT32_MAX && right <= INT32_MAX, "thdcp: window=(", left,
                    ", ", right, ") is not valid; pass (left, right) with -1 for unbounded and 0 or more otherwise, "
                    "e.g. (-1, 0) causal, (-1, -1) full, (4096, 0) causal sliding window");
  return Mask::window(static_cast<int32_t>(left), static_cast<int32_t>(right));
}

}  // namespace thdcp::torch_ops
