// Backward attention, fp16 storage, head_dim 128: the one instantiation of this file.
#include "attention_backward_launch.cuh"

namespace thdcp::cuda::detail {
template void launch_backward<Fp16Tag, 128>(const BackwardParams&, int, int, cudaStream_t);
}  // namespace thdcp::cuda::detail
