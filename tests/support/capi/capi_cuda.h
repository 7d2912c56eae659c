// Test support for the C ABI on the GPU (THDCP_BACKEND_CUDA): the batch and params of the
// cases, a step's device tensors as the C ABI takes them, the layout on the device, runs
// through the C ABI and through the C++ API, one CP rank, ranks on threads, and the merge
// of the ranks' rows.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/cuda/cuda_test.h"
#include "support/outputs.h"
#include "support/shape.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {

// ---- shapes and batches -----------------------------------------------------------------

// The capacity of varlen_batch: 10 sequences, 1088 rows.
inline const Capacity kVarlenCapacity{/*max_seqs=*/10, /*max_tokens=*/1088};

// Documents with an empty one, a one-token one and lengths that are not multiples of 4,
// each padded to a multiple of 4 (2 * cp for cp <= 2, so the CP cases split the same
// batch), in the capacity form the CUDA backend reads: placeholders after the documents,
// the last one absorbing the 68 slack rows.
Batch varlen_batch(const Shape& s, uint64_t seed);

// Params of the CUDA backend for `s` at `capacity`.
thdcp_attention_params cuda_attention_params(const Shape& s, const Capacity& capacity, DType grad_dtype);
thdcp_cp_params cuda_cp_params(const Shape& s, const Capacity& capacity, int cp);

// ---- device memory as the C ABI takes it ----------------------------------------------

// The descriptor of a contiguous device tensor.
thdcp_tensor_t c_device_tensor(void* data, DType dtype, int64_t rows, int64_t heads, int64_t head_dim);

size_t bytes_of(const thdcp_tensor_t& t);

// The same memory as a C++ view (for thdcp::cuda).
ThdTensor cpp_view(const thdcp_tensor_t& t);

// One step's tensors in device memory (a rank's rows, or the whole batch), as the C ABI
// takes them: inputs q, k, v, dout; outputs out, dq, dk, dv, lse [Hq, rows], max_logit [Hq].
struct StepTensors {
  thdcp_tensor_t q{}, k{}, v{}, dout{}, out{}, dq{}, dk{}, dv{};
  float* lse = nullptr;
  float* max_logit = nullptr;

  size_t lse_count() const { return static_cast<size_t>(q.heads * q.rows); }
  size_t max_logit_count() const { return static_cast<size_t>(q.heads); }
};

// The tensors of a step of `rows` rows of shape `s` (dq, dk, dv in `grad_dtype`), each in
// the device memory `allocate(name, bytes)` gives ("q", "k", ..., "lse", "max_logit").
StepTensors step_tensors(const Shape& s, int64_t rows, DType grad_dtype,
                         const std::function<void*(const char* name, size_t bytes)>& allocate);

// Device memory of a StepTensors (the graph case uses the bank's buffers instead).
class StepBuffers {
 public:
  StepBuffers(const Shape& s, int64_t rows, DType grad_dtype);
  const StepTensors& tensors() const { return t_; }

 private:
  std::vector<DeviceBuffer> buffers_;
  StepTensors t_;
};

// Copies the host inputs into t's inputs, on `stream`, complete on return.
void upload_inputs(const StepTensors& t, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                   const HostTensor& dout, cudaStream_t stream);

// Fills every output byte with `byte` on `stream`, complete on return. 0xff is NaN in fp32,
// fp16 and bf16, so an element no call wrote cannot pass a check.
void fill_outputs(const StepTensors& t, cudaStream_t stream, int byte = 0xff);

// The outputs, once the work enqueued on `stream` is done.
Outputs download_outputs(const StepTensors& t, cudaStream_t stream);

// A layout's two arrays in device memory, in capacity form (max_seqs + 1 entries each).
class LayoutOnDevice {
 public:
  explicit LayoutOnDevice(int max_seqs);

  // Complete on return.
  void upload(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, cudaStream_t stream);
  void upload(const BatchLayout& layout, cudaStream_t stream);
  thdcp_layout_t c() const;

 private:
  int num_seqs_;
  DeviceBuffer cu_seqlens_, cu_seqlens_padded_;
};

// ---- runs through the C ABI and the C++ API ---------------------------------------------

// A C ABI attention plan of `params` (CUDA backend) with a workspace of the size the library
// asks for. Destroy it only once its stream's work is done.
class AttentionPlan {
 public:
  explicit AttentionPlan(const thdcp_attention_params& params);
  ~AttentionPlan();
  AttentionPlan(const AttentionPlan&) = delete;
  AttentionPlan& operator=(const AttentionPlan&) = delete;
  thdcp_attention_plan_t get() const { return plan_; }

 private:
  DeviceBuffer workspace_;
  thdcp_attention_plan_t plan_ = nullptr;
};

// Forward then backward through a C ABI attention plan of `params`.
void c_attention(const thdcp_attention_params& params, const thdcp_layout_t& layout, const StepTensors& t,
                 cudaStream_t stream);

// The same through the C++ API: thdcp::test::attention_forward / attention_backward over the
// single-device table of the device layout (what the C ABI builds on its stream).
void cpp_attention(const Shape& s, const thdcp_layout_t& layout, const StepTensors& t, cudaStream_t stream);

// The single-device C ABI attention (CUDA backend) on the whole batch (in kVarlenCapacity
// form): the reference of the CP cases.
Outputs c_single_device(const Batch& b, const Shape& s);

// This rank's CP forward then backward through a C ABI CP plan (CUDA backend) over `comm`.
void c_cp_step(thdcp_communicator_t comm, const thdcp_cp_params& params, const thdcp_layout_t& layout,
               const StepTensors& t, cudaStream_t stream);

// One rank of a CP group on device 0: its rows of `b` (in kVarlenCapacity form) through a C
// ABI CP plan (dual-chunk layout; `mode` may set the communication and a2a_size); its outputs
// (local rows).
Outputs c_cp_rank(thdcp_communicator_t comm, const Batch& b, const Shape& s,
                  const std::function<void(thdcp_cp_params&)>& mode = {});

// Runs body(comm, rank) on a thread per rank, each with device 0 current. What a rank throws
// is a failure of the test (not std::terminate).
void run_ranks(const std::vector<thdcp_communicator_t>& comms,
               const std::function<void(thdcp_communicator_t, int)>& body);

// The global outputs from every rank's rows (thdcp_cp_merge; lse plane by plane), after
// checking with thdcp_cp_local_rows that the ranks' rows together are every global row once.
Outputs c_merge_ranks(const std::vector<Outputs>& local, const Batch& b);

// The GPU cases: skipped with the reason without a device; device 0 current.
class CApiCudaTest : public CudaTest {
 protected:
  void SetUp() override;
};

}  // namespace thdcp::test
