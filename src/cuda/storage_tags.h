// Storage tags for the kernel templates: the kernels never see thdcp::DType, the host
// launchers map one to the other. Shared by host (launch.h) and device (tensor_core.cuh)
// headers, so a device header needs no host launch header for a type.
#pragma once

namespace thdcp::cuda::detail {

struct Bf16Tag {};
struct Fp16Tag {};

}  // namespace thdcp::cuda::detail
