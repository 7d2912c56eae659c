// Backward attention, bf16 storage, head_dim 128: the one instantiation of this file.
#include "attention_backward_launch.cuh"

namespace thdcp::cuda::detail {
template void configure_backward<Bf16Tag, 128>(bool, bool);
template void launch_backward<Bf16Tag, 128>(const BackwardParams&, const BackwardStrides&, bool, int, int,
                                            cudaStream_t);
}  // namespace thdcp::cuda::detail
