// Forward attention, bf16 storage, head_dim 64: the one instantiation of this file.
#include "attention_forward_launch.cuh"

namespace thdcp::cuda::detail {
template void configure_forward<Bf16Tag, 64>(bool);
template void launch_forward<Bf16Tag, 64>(const ForwardParams&, const ForwardStrides&, const ForwardTensorMaps*, int,
                                              int, cudaStream_t);
}  // namespace thdcp::cuda::detail
