// Strided views for the stride tests of every backend: where a group of a call's THD tensors
// (q, k, v; or dq, dk, dv) sits in one buffer, in the arrangements users hand over, and host
// copies between such views and contiguous tensors.
//
// A test fills a host image of the group's buffer (poisoned: every byte 0xff, NaN for the
// float dtypes), runs a call on the views (the CPU backend on the host image, the CUDA one on
// a device copy of it), and compares what the views hold with a contiguous run bit for bit;
// bytes between the views must keep the poison (nothing wrote outside a view) and inputs their
// values.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/core/tensor.h"

namespace thdcp::test {

enum class Arrangement {
  kContiguous,   // each tensor [T, H, D] dense, one after another
  kPacked,       // one [T, sum of H, D] buffer (packed QKV, packed dQKV): rows shared
  kPadded,       // each tensor with head stride D + 8 and row stride H * (D + 8) + 16
  kHeadMajor,    // each tensor [H, T + 5, D] (heads before rows, a slice of a longer
                 // cache): row stride D, head stride (T + 5) * D
  kInterleaved,  // two-head tensors with row stride 2 D and head stride 3 D: head 1 of row t
                 // sits in the gap of row t + 1 (others as kPadded)
};

const char* arrangement_name(Arrangement a);
std::vector<Arrangement> all_arrangements();

// Where one tensor of a group sits: its first element and strides, in elements.
struct Placement {
  int64_t first = 0, row_stride = 0, head_stride = 0;
};

struct GroupLayout {
  int64_t elements = 0;  // of the group's buffer
  std::vector<Placement> placements;
};

// The layout of tensors of `rows` rows, heads[i] heads and `head_dim` elements per head. Every
// stride and offset is a multiple of 8 elements when head_dim is (the CUDA backend's 16 bytes).
GroupLayout arrange(Arrangement a, int64_t rows, const std::vector<int64_t>& heads, int64_t head_dim);

// The view of a tensor placed at `p` in a buffer that starts at `base` (host or device memory).
ThdTensor placed_view(void* base, DType dtype, int64_t rows, int64_t heads, int64_t head_dim, const Placement& p);

// A host buffer of `elements` elements of `dtype`, every byte 0xff.
std::vector<unsigned char> poisoned_image(DType dtype, int64_t elements);

// Copies a contiguous host tensor into a host view of its shape, and a host view into a new
// contiguous tensor.
void scatter_into(const HostTensor& src, const ThdTensor& view);
HostTensor gather_from(const ConstThdTensor& view);

// Every byte of `image` that none of `views` (host views into it) covers is still 0xff.
::testing::AssertionResult poison_kept_outside(const std::vector<unsigned char>& image,
                                               const std::vector<ConstThdTensor>& views);

}  // namespace thdcp::test
