// resolve_softmax_scale: the one rule every backend takes the softmax scale from.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "support/expect_error.h"
#include "thdcp/core/softmax_scale.h"

namespace thdcp::test {
namespace {

TEST(SoftmaxScale, ZeroMeansOneOverSqrtHeadDim) {
  EXPECT_EQ(resolve_softmax_scale(0.0f, 128), static_cast<float>(1.0 / std::sqrt(128.0)));
  EXPECT_EQ(resolve_softmax_scale(0.0f, 64), 0.125f);
}

TEST(SoftmaxScale, APositiveScaleIsKept) {
  EXPECT_EQ(resolve_softmax_scale(0.3f, 128), 0.3f);
  EXPECT_EQ(resolve_softmax_scale(2.0f, 64), 2.0f);
}

TEST(SoftmaxScale, NegativeOrNonFiniteIsRefusedByName) {
  EXPECT_THDCP_ERROR(resolve_softmax_scale(-0.5f, 128), "softmax_scale=-0.5 must be finite and >= 0");
  EXPECT_THDCP_ERROR(resolve_softmax_scale(std::numeric_limits<float>::infinity(), 128),
                     "softmax_scale=inf must be finite");
  EXPECT_THDCP_ERROR(resolve_softmax_scale(std::numeric_limits<float>::quiet_NaN(), 128), "must be finite and >= 0");
}

}  // namespace
}  // namespace thdcp::test
