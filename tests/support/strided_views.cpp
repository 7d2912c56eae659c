#include "support/strided_views.h"

#include <cstring>
#include <numeric>

#include "thdcp/core/error.h"

namespace thdcp::test {

const char* arrangement_name(Arrangement a) {
  switch (a) {
    case Arrangement::kContiguous: return "contiguous";
    case Arrangement::kPacked: return "packed";
    case Arrangement::kPadded: return "padded";
    case Arrangement::kHeadMajor: return "head_major";
    case Arrangement::kInterleaved: return "interleaved";
  }
  return "?";
}

std::vector<Arrangement> all_arrangements() {
  return {Arrangement::kContiguous, Arrangement::kPacked, Arrangement::kPadded, Arrangement::kHeadMajor,
          Arrangement::kInterleaved};
}

GroupLayout arrange(Arrangement a, int64_t rows, const std::vector<int64_t>& heads, int64_t head_dim) {
  GroupLayout g;
  const int64_t d = head_dim;
  if (a == Arrangement::kPacked) {
    const int64_t slots = std::accumulate(heads.begin(), heads.end(), int64_t{0});
    int64_t slot = 0;
    for (int64_t h : heads) {
      g.placements.push_back(Placement{slot * d, slots * d, d});
      slot += h;
    }
    g.elements = rows * slots * d;
    return g;
  }
  for (int64_t h : heads) {
    Placement p;
    p.first = g.elements;
    int64_t extent = 0;
    if (a == Arrangement::kContiguous) {
      p.row_stride = h * d;
      p.head_stride = d;
      extent = rows * h * d;
    } else if (a == Arrangement::kHeadMajor) {
      p.row_stride = d;
      p.head_stride = (rows + 5) * d;
      extent = h * (rows + 5) * d;
    } else if (a == Arrangement::kInterleaved && h == 2) {
      p.row_stride = 2 * d;
      p.head_stride = 3 * d;
      extent = (2 * rows + 2) * d;
    } else {  // kPadded, and kInterleaved for other head counts
      p.head_stride = d + 8;
      p.row_stride = h * (d + 8) + 16;
      extent = rows * p.row_stride;
    }
    g.placements.push_back(p);
    g.elements += extent + 8;  // a gap between tensors, poisoned too
  }
  return g;
}

ThdTensor placed_view(void* base, DType dtype, int64_t rows, int64_t heads, int64_t head_dim, const Placement& p) {
  return ThdTensor(static_cast<unsigned char*>(base) + static_cast<size_t>(p.first) * dtype_size(dtype), dtype, rows,
                   heads, head_dim, p.row_stride, p.head_stride);
}

std::vector<unsigned char> poisoned_image(DType dtype, int64_t elements) {
  return std::vector<unsigned char>(static_cast<size_t>(elements) * dtype_size(dtype), 0xff);
}

void scatter_into(const HostTensor& src, const ThdTensor& view) {
  THDCP_CHECK(src.tokens() == view.tokens && src.heads() == view.heads && src.head_dim() == view.head_dim &&
                  src.dtype() == view.dtype,
              "scatter_into: shapes differ");
  const size_t element = dtype_size(src.dtype());
  const size_t head_bytes = static_cast<size_t>(src.head_dim()) * element;
  for (int64_t r = 0; r < src.tokens(); ++r) {
    for (int64_t h = 0; h < src.heads(); ++h) {
      std::memcpy(static_cast<unsigned char*>(view.data) + static_cast<size_t>(view.offset(r, h, 0)) * element,
                  static_cast<const unsigned char*>(src.data()) +
                      static_cast<size_t>((r * src.heads() + h) * src.head_dim()) * element,
                  head_bytes);
    }
  }
}

HostTensor gather_from(const ConstThdTensor& view) {
  HostTensor out(view.dtype, view.tokens, view.heads, view.head_dim);
  const size_t element = dtype_size(view.dtype);
  const size_t head_bytes = static_cast<size_t>(view.head_dim) * element;
  for (int64_t r = 0; r < view.tokens; ++r) {
    for (int64_t h = 0; h < view.heads; ++h) {
      std::memcpy(static_cast<unsigned char*>(out.data()) +
                      static_cast<size_t>((r * view.heads + h) * view.head_dim) * element,
                  static_cast<const unsigned char*>(view.data) + static_cast<size_t>(view.offset(r, h, 0)) * element,
                  head_bytes);
    }
  }
  return out;
}

::testing::AssertionResult poison_kept_outside(const std::vector<unsigned char>& image,
                                               const std::vector<ConstThdTensor>& views) {
  std::vector<bool> covered(image.size(), false);
  const auto* base = image.data();
  for (const ConstThdTensor& v : views) {
    const size_t element = dtype_size(v.dtype);
    for (int64_t r = 0; r < v.tokens; ++r) {
      for (int64_t h = 0; h < v.heads; ++h) {
        const size_t start = static_cast<size_t>(static_cast<const unsigned char*>(v.data) - base) +
                             static_cast<size_t>(v.offset(r, h, 0)) * element;
        for (size_t i = 0; i < static_cast<size_t>(v.head_dim) * element; ++i) covered[start + i] = true;
      }
    }
  }
  for (size_t i = 0; i < image.size(); ++i) {
    if (!covered[i] && image[i] != 0xff) {
      return ::testing::AssertionFailure() << "byte " << i << " outside every view was written (0x" << std::hex
                                           << static_cast<int>(image[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace thdcp::test
