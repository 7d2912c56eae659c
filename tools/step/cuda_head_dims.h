// The head dims the CUDA kernels take, as the tool says them. Every usage text and refusal of
// run, run --graph, bench and bench --scaling asks the library here (cuda_supports_head_dims,
// cuda_head_dims_text), so that the commands take and name what the kernels do.
#pragma once

#include <cstdint>
#include <string>

namespace thdcp::tools {

// `usage` with each "{cuda head dims}" replaced by the (D_qk, D_v) pairs the CUDA kernels take
// in words (cuda::cuda_head_dims_text()), or by "none: this thdcp was built without CUDA".
std::string usage_with_cuda_head_dims(const char* usage);

// Empty when the CUDA kernels take head_dim (--head-dim) with v_head_dim (--v-head-dim; 0:
// D_v = head_dim); else why not, naming the flags, their values and what the kernels take:
// "--head-dim 192 --v-head-dim 64: the CUDA kernels take " + cuda::cuda_head_dims_text().
std::string cuda_head_dims_refusal(int64_t head_dim, int64_t v_head_dim);

// Throws UsageError (exit 2) with cuda_head_dims_refusal's reason, when there is one.
void require_cuda_head_dims(int64_t head_dim, int64_t v_head_dim);

}  // namespace thdcp::tools
