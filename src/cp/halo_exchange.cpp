#include "halo_exchange.h"

#include <cstring>

#include "thdcp/plan/rank_split.h"

namespace thdcp::cp::detail {

HaloExchange::HaloExchange(const LayoutView& layout, const Problem& p, int rank)
    : cp_(p.cp), rank_(rank), local_rows_(p.local_rows()), rows_(static_cast<size_t>(p.cp) * p.cp) {
  for (int r = 0; r < cp_; ++r) {
    halos_.push_back(thdcp::halo_rows(layout, cp_, r, p.mask, p.layout));
    for (const HaloRun& run : halos_.back()) rows_[static_cast<size_t>(r * cp_ + run.source_rank)] += run.rows;
  }
}

int64_t HaloExchange::halo_rows(int rank) const {
  int64_t rows = 0;
  for (int source = 0; source < cp_; ++source) rows += rows_between(rank, source);
  return rows;
}

int64_t HaloExchange::returned_rows(int rank) const {
  int64_t rows = 0;
  for (int receiver = 0; receiver < cp_; ++receiver) rows += rows_between(receiver, rank);
  return rows;
}

int64_t HaloExchange::total_halo_rows() const {
  int64_t rows = 0;
  for (int64_t r : rows_) rows += r;
  return rows;
}

void HaloExchange::gather(Communicator& comm, const unsigned char* local, size_t row_bytes,
                          std::vector<unsigned char>& send, unsigned char* gathered) const {
  std::vector<size_t> send_bytes(static_cast<size_t>(cp_)), recv_bytes(static_cast<size_t>(cp_));
  for (int r = 0; r < cp_; ++r) {
    send_bytes[static_cast<size_t>(r)] = static_cast<size_t>(rows_between(r, rank_)) * row_bytes;
    recv_bytes[static_cast<size_t>(r)] = static_cast<size_t>(rows_between(rank_, r)) * row_bytes;
  }
  send.resize(static_cast<size_t>(returned_rows(rank_)) * row_bytes);
  unsigned char* to = send.data();
  for (int receiver = 0; receiver < cp_; ++receiver) {
    for (const HaloRun& run : halos_[static_cast<size_t>(receiver)]) {
      if (run.source_rank != rank_) continue;
      const size_t bytes = static_cast<size_t>(run.rows) * row_bytes;
      std::memcpy(to, local + static_cast<size_t>(run.local_row) * row_bytes, bytes);
      to += bytes;
    }
  }
  const size_t own_bytes = static_cast<size_t>(local_rows_) * row_bytes;
  if (own_bytes > 0) std::memcpy(gathered, local, own_bytes);
  comm.all_to_all_v(send.data(), send_bytes.data(), gathered + own_bytes, recv_bytes.data());
}

void HaloExchange::to_sequence_order(const unsigned char* gathered, size_t row_bytes,
                                     const std::vector<int32_t>& own_map, unsigned char* sequence) const {
  scatter_rows(gathered, sequence, own_map, row_bytes);
  const unsigned char* from = gathered + static_cast<size_t>(local_rows_) * row_bytes;
  for (const HaloRun& run : halos_[static_cast<size_t>(rank_)]) {
    const size_t bytes = static_cast<size_t>(run.rows) * row_bytes;
    std::memcpy(sequence + static_cast<size_t>(run.global_row) * row_bytes, from, bytes);
    from += bytes;
  }
}

void HaloExchange::pack_gradients(const float* sequence, int64_t width, const std::vector<int32_t>& own_map,
                                  float* packed) const {
  const size_t row_floats = static_cast<size_t>(width);
  gather_rows(sequence, packed, own_map, row_floats * sizeof(float));
  float* to = packed + static_cast<size_t>(local_rows_) * row_floats;
  for (const HaloRun& run : halos_[static_cast<size_t>(rank_)]) {
    const size_t floats = static_cast<size_t>(run.rows) * row_floats;
    std::memcpy(to, sequence + static_cast<size_t>(run.global_row) * row_floats, floats * sizeof(float));
    to += floats;
  }
}

void HaloExchange::sum_gradients(Communicator& comm, const float* packed, int64_t width, std::vector<float>& received,
                                 float* local) const {
  const size_t row_bytes = static_cast<size_t>(width) * sizeof(float);
  std::vector<size_t> send_bytes(static_cast<size_t>(cp_)), recv_bytes(static_cast<size_t>(cp_));
  for (int r = 0; r < cp_; ++r) {
    send_bytes[static_cast<size_t>(r)] = static_cast<size_t>(rows_between(rank_, r)) * row_bytes;
    recv_bytes[static_cast<size_t>(r)] = static_cast<size_t>(rows_between(r, rank_)) * row_bytes;
  }
  received.resize(static_cast<size_t>(returned_rows(rank_) * width));
  const float* own = packed;
  comm.all_to_all_v(packed + static_cast<size_t>(local_rows_ * width), send_bytes.data(), received.data(),
                    recv_bytes.data());

  // Rank order, from +0.0f: reduce_scatter_sum's order, so the sums have its bits.
  const size_t local_floats = static_cast<size_t>(local_rows_ * width);
  for (size_t i = 0; i < local_floats; ++i) local[i] = 0.0f;
  const float* from = received.data();
  for (int r = 0; r < cp_; ++r) {
    if (r == rank_) {
      for (size_t i = 0; i < local_floats; ++i) local[i] += own[i];
      continue;
    }
    for (const HaloRun& run : halos_[static_cast<size_t>(r)]) {
      if (run.source_rank != rank_) continue;
      float* to = local + static_cast<size_t>(run.local_row * width);
      const size_t floats = static_cast<size_t>(run.rows * width);
      for (size_t i = 0; i < floats; ++i) to[i] += from[i];
      from += floats;
    }
  }
}

}  // namespace thdcp::cp::detail
