#include "support/cuda/head_dims.h"

#include <gtest/gtest.h>

#include <cctype>

#include "thdcp/cuda/attention.h"

namespace thdcp::test {

const std::vector<HeadDims>& served_head_dims() {
  static const std::vector<HeadDims> dims = {{64, 0}, {96, 0}, {128, 0}, {192, 0}, {256, 0}, {192, 128}};
  return dims;
}

const std::vector<HeadDims>& refused_head_dims() {
  static const std::vector<HeadDims> dims = {{32, 0}, {160, 0}, {128, 64}, {256, 128}, {64, 128}};
  return dims;
}

std::string head_dims_label(const HeadDims& dims) {
  std::string label = "d" + std::to_string(dims.head_dim);
  if (dims.v_head_dim != 0 && dims.v_head_dim != dims.head_dim) label += "_v" + std::to_string(dims.v_head_dim);
  return label;
}

namespace {

// `text` holds `value` as a number of its own (no digit right before or after it).
bool names_number(const std::string& text, int value) {
  const std::string number = std::to_string(value);
  for (size_t at = text.find(number); at != std::string::npos; at = text.find(number, at + 1)) {
    const bool digit_before = at > 0 && std::isdigit(static_cast<unsigned char>(text[at - 1]));
    const size_t end = at + number.size();
    const bool digit_after = end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]));
    if (!digit_before && !digit_after) return true;
  }
  return false;
}

}  // namespace

void expect_names_head_dims(const std::string& message, const HeadDims& dims) {
  if (message.empty()) {
    ADD_FAILURE() << head_dims_label(dims) << " was not refused: no thdcp::Error";
    return;
  }
  const std::string supported = cuda::cuda_head_dims_text();
  const size_t at = message.find(supported);
  EXPECT_NE(at, std::string::npos) << "message: " << message << "\nmissing the supported set: " << supported;
  // The supported set names 64, 128, ... itself: the pair must be named outside it.
  std::string rest = message;
  if (at != std::string::npos) rest.erase(at, supported.size());
  EXPECT_TRUE(names_number(rest, dims.head_dim)) << "message: " << message << "\ndoes not name D_qk " << dims.head_dim;
  if (dims.v_head_dim != 0 && dims.v_head_dim != dims.head_dim) {
    EXPECT_TRUE(names_number(rest, dims.v_head_dim))
        << "message: " << message << "\ndoes not name D_v " << dims.v_head_dim;
  }
}

}  // namespace thdcp::test
