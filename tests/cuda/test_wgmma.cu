// The Hopper building blocks of src/cuda/wgmma.cuh on their own: one warpgroup MMA per case
// with operands in the wgmma tile layout (written element by element from the layout
// formula, wgmma_tile_offset) and the descriptors the kernels use, against a CPU product of
// small integers (exact in bf16 and fp32). Covers each form the kernels issue:
//   K-major A and B from shared memory, N = 64     (S = Q K^T; S^T = K Q^T),
//   A from registers, MN-major B, N = 64 and 128   (dQ = dS K, dV = P^T dO, O = P V; D 64/128),
//   A from registers, K-major B, N = 64.
// Needs a compute capability 9.x device (the kernel is compiled for sm_90a); elsewhere the
// cases report as skipped, with the reason.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/wgmma.cuh"
#include "support/cuda/cuda_test.h"

namespace thdcp::test {
namespace {

using cuda::detail::Bf16Tag;

constexpr int kTileRows = 64;  // rows of every wgmma tile in the kernels
constexpr int kK = 16;         // one k-step

enum class Form { kSharedKMajor, kRegistersMNMajor, kRegistersKMajor };

// d[64][N] = a[64][16] b[16][N] by one wgmma of the given form; a and b row-major in global
// memory. Tile rows are zero beyond what the product reads.
template <int N>
__global__ void one_wgmma(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d, Form form) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cuda::detail;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw);
  const uint32_t a_tile = (raw + 1023u) & ~1023u;
  const uint32_t b_tile = a_tile + kTileRows * 64 * 2 * 2;  // room for a 64 x 128 tile
  auto* a_elements = reinterpret_cast<__nv_bfloat16*>(smem_raw + (a_tile - raw));
  auto* b_elements = reinterpret_cast<__nv_bfloat16*>(smem_raw + (b_tile - raw));
  // A as a K-major tile: row m, column k.
  for (int i = threadIdx.x; i < 64 * kK; i += blockDim.x) {
    const int m = i / kK, k = i % kK;
    a_elements[wgmma_tile_offset<kTileRows>(m, k / 8) + k % 8] = a[i];
  }
  for (int i = threadIdx.x; i < kK * N; i += blockDim.x) {
    const int k = i / N, n = i % N;
    if (form == Form::kRegistersMNMajor) {
      b_elements[wgmma_tile_offset<kTileRows>(k, n / 8) + n % 8] = b[i];  // row k, column n
    } else {
      b_elements[wgmma_tile_offset<kTileRows>(n, k / 8) + k % 8] = b[i];  // row n, column k
    }
  }
  fence_proxy_async_shared();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = warp * 16 + lane / 4, col = (lane % 4) * 2;
  auto pair = [&](int r, int c) {
    __nv_bfloat162 p;
    p.x = a[r * kK + c];
    p.y = a[r * kK + c + 1];
    return *reinterpret_cast<uint32_t*>(&p);
  };
  const uint32_t a_fragment[4] = {pair(row, col), pair(row + 8, col), pair(row, col + 8), pair(row + 8, col + 8)};
  float acc[N / 8][4];
  wgmma_fence();
  if (form == Form::kSharedKMajor) {
    WgmmaSs<Bf16Tag, N>::template run<0, 0>(flat(acc), wgmma_desc_k_major<kTileRows>(a_tile, 0),
                                            wgmma_desc_k_major<kTileRows>(b_tile, 0), 0);
  } else if (form == Form::kRegistersMNMajor) {
    WgmmaRs<Bf16Tag, N>::template run<1>(flat(acc), a_fragment, wgmma_desc_mn_major<kTileRows>(b_tile, 0), 0);
  } else {
    WgmmaRs<Bf16Tag, N>::template run<0>(flat(acc), a_fragment, wgmma_desc_k_major<kTileRows>(b_tile, 0), 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(flat(acc));
  for (int nf = 0; nf < N / 8; ++nf) {
    for (int e = 0; e < 4; ++e) d[(row + (e / 2) * 8) * N + nf * 8 + col + e % 2] = acc[nf][e];
  }
#endif
}

class Wgmma : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    int device = 0, major = 0;
    THDCP_CHECK_CUDA(cudaGetDevice(&device));
    THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major != 9) GTEST_SKIP() << "wgmma needs compute capability 9.x; this device has " << major << ".x";
  }

  template <int N>
  void check(Form form) {
    std::vector<float> a(64 * kK), b(kK * N);
    std::vector<__nv_bfloat16> a16(a.size()), b16(b.size());
    uint64_t state = 12345 + N + static_cast<int>(form);
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<int>((state >> 33) % 9) - 4);
    };
    for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2bfloat16(a[i] = next());
    for (size_t i = 0; i < b.size(); ++i) b16[i] = __float2bfloat16(b[i] = next());
    DeviceBuffer a_device(a16.size() * 2), b_device(b16.size() * 2), d_device(64 * N * sizeof(float));
    a_device.upload(a16.data(), a16.size() * 2);
    b_device.upload(b16.data(), b16.size() * 2);
    const size_t smem = 4 * kTileRows * 64 * 2 + 1024;
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(one_wgmma<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    one_wgmma<N><<<1, 128, smem>>>(static_cast<const __nv_bfloat16*>(a_device.data()),
                                   static_cast<const __nv_bfloat16*>(b_device.data()),
                                   static_cast<float*>(d_device.data()), form);
    THDCP_CHECK_CUDA(cudaGetLastError());
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> d = download_vector<float>(d_device, 64 * N);
    int wrong = 0;
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < N; ++n) {
        float expected = 0.0f;
        for (int k = 0; k < kK; ++k) expected += a[m * kK + k] * b[k * N + n];
        if (d[m * N + n] != expected && ++wrong <= 5) {
          ADD_FAILURE() << "d[" << m << "][" << n << "] = " << d[m * N + n] << ", expected " << expected;
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << 64 * N;
  }
};

TEST_F(Wgmma, SharedKMajorN64) { check<64>(Form::kSharedKMajor); }
TEST_F(Wgmma, SharedKMajorN128) { check<128>(Form::kSharedKMajor); }
TEST_F(Wgmma, RegistersMNMajorN64) { check<64>(Form::kRegistersMNMajor); }
TEST_F(Wgmma, RegistersMNMajorN128) { check<128>(Form::kRegistersMNMajor); }
TEST_F(Wgmma, RegistersKMajorN64) { check<64>(Form::kRegistersKMajor); }

}  // namespace
}  // namespace thdcp::test
