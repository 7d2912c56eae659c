// THDCP_HD marks functions shared by host code and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define THDCP_HD __host__ __device__ __forceinline__
#else
#define THDCP_HD inline
#endif
