// The (D_qk, D_v) head-dim pairs of the CUDA backend's tests (issue 27): the pairs it serves,
// pairs it must refuse, their names in test names, and the check of a refusal's message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace thdcp::test {

// D_qk (q, k, dq, dk) and D_v (v, out, dout, dv); v_head_dim 0 means D_v = D_qk, as in HeadShape.
struct HeadDims {
  int head_dim = 0;
  int v_head_dim = 0;
};

// Every pair the CUDA backend serves: D_qk = D_v in {64, 96, 128, 192, 256} and MLA's
// (192, 128).
const std::vector<HeadDims>& served_head_dims();

// Pairs it refuses: head dims it has no kernels for (32, 160) and D_v other than D_qk outside
// MLA's (128/64, 256/128, 64/128).
const std::vector<HeadDims>& refused_head_dims();

// "d96" for D_qk = D_v = 96, "d192_v128" for MLA: a pair in a test's name.
std::string head_dims_label(const HeadDims& dims);

// The message of a refused pair names the supported set (cuda::cuda_head_dims_text()) and,
// outside that text, every value of the pair (D_qk, and D_v where it is not D_qk) as a number
// of its own.
void expect_names_head_dims(const std::string& message, const HeadDims& dims);

}  // namespace thdcp::test
