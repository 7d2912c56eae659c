// Forward attention, fp16 storage, head_dim 128: the one instantiation of this file.
#include "attention_forward_launch.cuh"

namespace thdcp::cuda::detail {
template void configure_forward<Fp16Tag, 128>(bool);
template void launch_forward<Fp16Tag, 128>(const ForwardParams&, const ForwardStrides&, const ForwardTensorMaps*, int,
                                              int, cudaStream_t);
}  // namespace thdcp::cuda::detail
