// A naive fp64 attention that materialises every score matrix: the independent reference
// the CPU backend is tested against. Per sequence it works on positions 0..L-1 and never
// looks at segment tables.
#pragma once

#include <vector>

#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"
#include "thdcp/core/tensor.h"

namespace thdcp::test {

struct NaiveResult {
  std::vector<double> out, lse, max_logit, dq, dk, dv;
};

// Forward and backward of every sequence of `layout`. The backward's softmax correction
// delta = dO . O uses `out_for_delta` (the tested implementation's stored out), as every
// flash-attention backward does, so the comparison isolates the backward itself.
NaiveResult naive_attention(const LayoutView& layout, const Mask& mask, const HostTensor& q, const HostTensor& k,
                            const HostTensor& v, const HostTensor& dout, const HostTensor& out_for_delta, double scale);

}  // namespace thdcp::test
