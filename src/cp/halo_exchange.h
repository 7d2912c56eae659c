// The halo gathers of the CPU step set (Problem::kv_gather; thdcp/plan/halo.h): which rows
// move between which ranks in a step, and the moves themselves.
//
// Every rank computes every rank's halo from the global layout, so each knows what it sends
// and what it receives. K/V: rank s sends rank r the rows of r's halo that s holds, in the
// order of r's halo runs; r places them at their global rows, beside its own, so the
// attention reads the buffer it would read after a whole gather (rows outside the table's
// key ranges are never read). dK/dV: the other way; the holder of a row adds the fp32 partial
// sums of the ranks that reached it to its own in rank order from +0.0f, as
// Communicator::reduce_scatter_sum adds every rank's (a rank that did not reach the row
// would add an exact +0.0f, which changes no such sum: the bits are the whole gather's).
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/halo.h"

namespace thdcp::cp::detail {

class HaloExchange {
 public:
  // Every rank's halo of one step of `layout` (validated by the caller), seen from `rank`.
  HaloExchange(const LayoutView& layout, const Problem& problem, int rank);

  // Rows of `receiver`'s halo that `source` holds.
  int64_t rows_between(int receiver, int source) const {
    return rows_[static_cast<size_t>(receiver) * static_cast<size_t>(cp_) + static_cast<size_t>(source)];
  }
  int64_t halo_rows(int rank) const;      // what `rank` receives in a gather
  int64_t returned_rows(int rank) const;  // dK/dV rows `rank` receives back
  int64_t total_halo_rows() const;        // over every rank

  // All-gather's replacement: this rank's rows `local` (dense, T/cp rows of row_bytes) then
  // its halo rows (in the order of its runs) into `gathered`; `send` is staging.
  void gather(Communicator& comm, const unsigned char* local, size_t row_bytes, std::vector<unsigned char>& send,
              unsigned char* gathered) const;
  // gather's output into the sequence-order buffer: own rows by `own_map` (rank_row_map),
  // halo rows at their global rows.
  void to_sequence_order(const unsigned char* gathered, size_t row_bytes, const std::vector<int32_t>& own_map,
                         unsigned char* sequence) const;

  // The fp32 dK or dV of every gathered row, `sequence` ([T, width] in sequence order), as
  // [own rows in local order | halo rows in the order of the runs] into `packed`.
  void pack_gradients(const float* sequence, int64_t width, const std::vector<int32_t>& own_map, float* packed) const;
  // Reduce-scatter's replacement: sends the halo part of `packed` to its holders and writes
  // this rank's rows ([T/cp, width]), summed over the ranks that reached them in rank order.
  void sum_gradients(Communicator& comm, const float* packed, int64_t width, std::vector<float>& received,
                     float* local) const;

 private:
  int cp_, rank_;
  int64_t local_rows_;
  std::vector<std::vector<HaloRun>> halos_;  // by rank
  std::vector<int64_t> rows_;                // [receiver * cp + source]
};

}  // namespace thdcp::cp::detail
