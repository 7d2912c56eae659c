// A group of THD views of one call (q, k, v; or dq, dk, dv) in one buffer, in an arrangement
// of support/strided_views.h, on the host and on the device: a test fills the host image,
// uploads it, runs a call on the device views, downloads it and reads the host views.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/strided_views.h"

namespace thdcp::test {

struct PlacedGroup {
  DType dtype;
  int64_t rows, head_dim;
  std::vector<int64_t> heads;
  GroupLayout at;
  std::vector<unsigned char> image;  // poisoned until written
  DeviceBuffer device;

  PlacedGroup(Arrangement a, DType dtype_, int64_t rows_, std::vector<int64_t> heads_, int64_t head_dim_)
      : dtype(dtype_), rows(rows_), head_dim(head_dim_), heads(std::move(heads_)),
        at(arrange(a, rows_, heads, head_dim_)), image(poisoned_image(dtype_, at.elements)), device(image.size()) {}

  // View i into the host image, or into the device copy.
  ThdTensor host(size_t i) { return placed_view(image.data(), dtype, rows, heads[i], head_dim, at.placements[i]); }
  ThdTensor on_device(size_t i) const {
    return placed_view(device.data(), dtype, rows, heads[i], head_dim, at.placements[i]);
  }
  std::vector<ConstThdTensor> host_views() {
    std::vector<ConstThdTensor> views;
    for (size_t i = 0; i < heads.size(); ++i) views.push_back(host(i));
    return views;
  }
  // Synchronous copies of the whole image (the legacy stream: synchronise other streams first).
  void upload() { device.upload(image.data(), image.size()); }
  void download() { device.download(image.data(), image.size()); }
};

}  // namespace thdcp::test
