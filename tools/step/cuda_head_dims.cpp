#include "step/cuda_head_dims.h"

#include "io/args.h"

#if defined(THDCP_CLI_WITH_CUDA)
#include "thdcp/cuda/attention.h"
#endif

namespace thdcp::tools {

namespace {

const char* cuda_head_dims_words() {
#if defined(THDCP_CLI_WITH_CUDA)
  return cuda::cuda_head_dims_text();
#else
  return "none: this thdcp was built without CUDA";
#endif
}

}  // namespace

std::string usage_with_cuda_head_dims(const char* usage) {
  static const std::string kMarker = "{cuda head dims}";
  std::string text = usage;
  for (size_t at = text.find(kMarker); at != std::string::npos; at = text.find(kMarker, at)) {
    text.replace(at, kMarker.size(), cuda_head_dims_words());
  }
  return text;
}

std::string cuda_head_dims_refusal(int64_t head_dim, int64_t v_head_dim) {
#if defined(THDCP_CLI_WITH_CUDA)
  if (cuda::cuda_supports_head_dims(head_dim, v_head_dim)) return std::string();
#endif
  std::string flags = "--head-dim " + std::to_string(head_dim);
  if (v_head_dim != 0 && v_head_dim != head_dim) flags += " --v-head-dim " + std::to_string(v_head_dim);
  return flags + ": the CUDA kernels take " + cuda_head_dims_words();
}

void require_cuda_head_dims(int64_t head_dim, int64_t v_head_dim) {
  const std::string refusal = cuda_head_dims_refusal(head_dim, v_head_dim);
  if (!refusal.empty()) throw UsageError(refusal);
}

}  // namespace thdcp::tools
