// Backward attention, fp16 storage, head_dim 64: the one instantiation of this file.
#include "attention_backward_launch.cuh"

namespace thdcp::cuda::detail {
template void configure_backward<Fp16Tag, 64>(bool, bool);
template void launch_backward<Fp16Tag, 64>(const BackwardParams&, const BackwardStrides&, bool, int, int,
                                            cudaStream_t);
}  // namespace thdcp::cuda::detail
