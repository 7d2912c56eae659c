#include "support/comm/collective_step.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace thdcp::test {
namespace {

// The rules every rank fills its inputs by, from (rank, index).
unsigned char gathered_byte(int rank, size_t index) {
  return static_cast<unsigned char>((static_cast<size_t>(rank) * 131 + index * 7 + 1) & 0xff);
}
float scattered_value(int rank, int block, size_t index) {
  return static_cast<float>((rank + 1) * (block + 2) + static_cast<int>(index % 13));
}
// Byte `index` of the block `sender` sends to `receiver` in all_to_all.
unsigned char exchanged_byte(int sender, int receiver, size_t index) {
  const size_t value = static_cast<size_t>(sender) * 37 + static_cast<size_t>(receiver) * 11 + index * 5 + 3;
  return static_cast<unsigned char>(value & 0xff);
}
float max_input(int rank, size_t index) {
  return static_cast<float>(static_cast<int>((index * 7 + static_cast<size_t>(rank) * 13) % 101) - 50);
}

void upload(cuda::DeviceBuffer& buffer, const void* host, cudaStream_t stream) {
  THDCP_CHECK_CUDA(cudaMemcpyAsync(buffer.data(), host, buffer.bytes(), cudaMemcpyHostToDevice, stream));
}

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& buffer, cudaStream_t stream) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  THDCP_CHECK_CUDA(cudaMemcpyAsync(host.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace

std::vector<CollectiveSizes> collective_sizes() {
  return {{1, 1}, {4099, 1027}, {(size_t{1} << 22) + 3, (size_t{1} << 20) + 5}};
}

CollectiveStep::CollectiveStep(int rank, int size, CollectiveSizes sizes)
    : rank_(rank),
      size_(size),
      sizes_(sizes),
      gather_send_(sizes.gather_bytes),
      gather_recv_(sizes.gather_bytes * static_cast<size_t>(size)),
      scatter_send_(sizes.count * static_cast<size_t>(size) * sizeof(float)),
      scatter_recv_(sizes.count * sizeof(float)),
      max_pristine_(sizes.count * sizeof(float)),
      max_data_(sizes.count * sizeof(float)),
      exchange_send_(sizes.gather_bytes * static_cast<size_t>(size)),
      exchange_recv_(sizes.gather_bytes * static_cast<size_t>(size)) {}

void CollectiveStep::prepare(cudaStream_t stream) {
  std::vector<unsigned char> bytes(sizes_.gather_bytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = gathered_byte(rank_, i);
  std::vector<float> blocks(sizes_.count * static_cast<size_t>(size_));
  for (int block = 0; block < size_; ++block) {
    for (size_t i = 0; i < sizes_.count; ++i) {
      blocks[static_cast<size_t>(block) * sizes_.count + i] = scattered_value(rank_, block, i);
    }
  }
  std::vector<float> values(sizes_.count);
  for (size_t i = 0; i < values.size(); ++i) values[i] = max_input(rank_, i);
  std::vector<unsigned char> exchanged(sizes_.gather_bytes * static_cast<size_t>(size_));
  for (int receiver = 0; receiver < size_; ++receiver) {
    for (size_t i = 0; i < sizes_.gather_bytes; ++i) {
      exchanged[static_cast<size_t>(receiver) * sizes_.gather_bytes + i] = exchanged_byte(rank_, receiver, i);
    }
  }
  upload(gather_send_, bytes.data(), stream);
  upload(scatter_send_, blocks.data(), stream);
  upload(max_pristine_, values.data(), stream);
  upload(exchange_send_, exchanged.data(), stream);
  for (cuda::DeviceBuffer* out : {&gather_recv_, &scatter_recv_, &max_data_, &exchange_recv_}) {
    THDCP_CHECK_CUDA(cudaMemsetAsync(out->data(), 0xff, out->bytes(), stream));
  }
  // The host vectors go out of scope: the copies from them must be done.
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

void CollectiveStep::enqueue(DeviceCommunicator& comm, cudaStream_t stream) {
  THDCP_CHECK_CUDA(
      cudaMemcpyAsync(max_data_.data(), max_pristine_.data(), max_data_.bytes(), cudaMemcpyDeviceToDevice, stream));
  comm.all_gather(gather_send_.data(), gather_recv_.data(), sizes_.gather_bytes, stream);
  comm.reduce_scatter_sum(scatter_send_.as<float>(), scatter_recv_.as<float>(), sizes_.count, stream);
  comm.all_reduce_max(max_data_.as<float>(), sizes_.count, stream);
  comm.all_to_all(exchange_send_.data(), exchange_recv_.data(), sizes_.gather_bytes, stream);
}

::testing::AssertionResult CollectiveStep::check(cudaStream_t stream) const {
  const std::vector<unsigned char> gathered = download<unsigned char>(gather_recv_, stream);
  const std::vector<float> scattered = download<float>(scatter_recv_, stream);
  const std::vector<float> maxima = download<float>(max_data_, stream);
  const std::vector<unsigned char> exchanged = download<unsigned char>(exchange_recv_, stream);
  std::string first;
  size_t wrong = 0;
  for (int peer = 0; peer < size_; ++peer) {
    for (size_t i = 0; i < sizes_.gather_bytes; ++i) {
      const unsigned char got = gathered[static_cast<size_t>(peer) * sizes_.gather_bytes + i];
      if (got == gathered_byte(peer, i)) continue;
      if (wrong++ == 0) {
        first = "all_gather: byte " + std::to_string(i) + " of rank " + std::to_string(peer) + "'s block is " +
                std::to_string(got) + ", expected " + std::to_string(gathered_byte(peer, i));
      }
    }
  }
  for (int peer = 0; peer < size_; ++peer) {
    for (size_t i = 0; i < sizes_.gather_bytes; ++i) {
      const unsigned char got = exchanged[static_cast<size_t>(peer) * sizes_.gather_bytes + i];
      if (got == exchanged_byte(peer, rank_, i)) continue;
      if (wrong++ == 0) {
        first = "all_to_all: byte " + std::to_string(i) + " from rank " + std::to_string(peer) + " is " +
                std::to_string(got) + ", expected " + std::to_string(exchanged_byte(peer, rank_, i));
      }
    }
  }
  for (size_t i = 0; i < sizes_.count; ++i) {
    float expected = 0;
    for (int peer = 0; peer < size_; ++peer) expected += scattered_value(peer, rank_, i);
    float maximum = max_input(0, i);
    for (int peer = 1; peer < size_; ++peer) maximum = std::max(maximum, max_input(peer, i));
    if (!(scattered[i] == expected) && wrong++ == 0) {
      first = "reduce_scatter_sum: element " + std::to_string(i) + " is " + std::to_string(scattered[i]) +
              ", expected " + std::to_string(expected);
    }
    if (!(maxima[i] == maximum) && wrong++ == 0) {
      first = "all_reduce_max: element " + std::to_string(i) + " is " + std::to_string(maxima[i]) + ", expected " +
              std::to_string(maximum);
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rank " << rank_ << " of " << size_ << ", " << sizes_.gather_bytes
                                       << " bytes / " << sizes_.count << " floats: " << wrong
                                       << " wrong values; first: " << first;
}

void expect_exact_collectives(DeviceCommunicator& comm, cudaStream_t stream) {
  for (const CollectiveSizes& sizes : collective_sizes()) {
    CollectiveStep step(comm.rank(), comm.size(), sizes);
    step.prepare(stream);
    step.enqueue(comm, stream);
    comm.synchronize(stream, kTestTimeoutSeconds);
    EXPECT_TRUE(step.check(stream));
  }
}

void expect_captured_step_replays(DeviceCommunicator& comm, cudaStream_t stream, cudaStreamCaptureMode mode) {
  const CollectiveSizes sizes{4099, 1027};
  CollectiveStep step(comm.rank(), comm.size(), sizes);
  step.prepare(stream);
  step.enqueue(comm, stream);
  comm.synchronize(stream, kTestTimeoutSeconds);
  ASSERT_TRUE(step.check(stream)) << " (eager run, before capture)";

  CapturedGraph captured;
  THDCP_CHECK_CUDA(cudaStreamBeginCapture(stream, mode));
  step.enqueue(comm, stream);
  THDCP_CHECK_CUDA(cudaStreamEndCapture(stream, &captured.graph));
  THDCP_CHECK_CUDA(cudaGraphInstantiate(&captured.exec, captured.graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    step.prepare(stream);
    THDCP_CHECK_CUDA(cudaGraphLaunch(captured.exec, stream));
    comm.synchronize(stream, kTestTimeoutSeconds);
    EXPECT_TRUE(step.check(stream)) << " (replay " << replay << ")";
  }
}

void expect_reduce_scatter16(DeviceCommunicator& comm, cudaStream_t stream, bool rank_order) {
  const int size = comm.size(), rank = comm.rank();
  const size_t count = 4099;
  // Values of a few magnitudes with low bits set, so that sums need rounding.
  const auto value = [](int r, int block, size_t i) {
    return static_cast<float>(1.0 + static_cast<double>((i * 37 + static_cast<size_t>(r) * 11 + block * 5) % 97) / 64.0) *
           static_cast<float>(1 << ((i + static_cast<size_t>(r)) % 5));
  };
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const bool bf16 = dtype == DType::kBFloat16;
    const auto narrow = [bf16](float x) { return bf16 ? float_to_bf16(x) : float_to_fp16(x); };
    const auto widen = [bf16](uint16_t h) { return bf16 ? bf16_to_float(h) : fp16_to_float(h); };
    std::vector<uint16_t> send(count * static_cast<size_t>(size));
    for (int block = 0; block < size; ++block) {
      for (size_t i = 0; i < count; ++i) send[static_cast<size_t>(block) * count + i] = narrow(value(rank, block, i));
    }
    cuda::DeviceBuffer send_buffer(send.size() * sizeof(uint16_t)), recv_buffer(count * sizeof(uint16_t));
    upload(send_buffer, send.data(), stream);
    comm.reduce_scatter_sum(send_buffer.data(), recv_buffer.data(), count, dtype, stream);
    comm.synchronize(stream, kTestTimeoutSeconds);
    const std::vector<uint16_t> got = download<uint16_t>(recv_buffer, stream);
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      float in_order = 0;
      double exact = 0, magnitude = 0;
      for (int r = 0; r < size; ++r) {
        const float x = widen(narrow(value(r, rank, i)));
        in_order = r == 0 ? x : in_order + x;
        exact += x;
        magnitude += std::abs(static_cast<double>(x));
      }
      const uint16_t want = narrow(in_order);
      const double result = widen(got[i]);
      const bool ok = rank_order ? got[i] == want
                                 : std::abs(result - exact) <= size * dtype_unit_roundoff(dtype) * magnitude;
      if (!ok && ++wrong <= 3) ADD_FAILURE() << "element " << i << ": " << result << ", want " << widen(want);
    }
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace thdcp::test
