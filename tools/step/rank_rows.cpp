#include "step/rank_rows.h"

#include "thdcp/plan/rank_split.h"

namespace thdcp::tools {

HostTensor split_for_rank(const HostTensor& global, const LayoutView& layout, int cp, int rank, CpLayout cp_layout) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  thdcp::split_for_rank(global.data(), local.data(), global.row_bytes(), layout, cp, rank, cp_layout);
  return local;
}

void merge_from_rank(const HostTensor& local, HostTensor& global, const LayoutView& layout, int cp, int rank,
                     CpLayout cp_layout) {
  thdcp::merge_from_rank(local.data(), global.data(), local.row_bytes(), layout, cp, rank, cp_layout);
}

std::vector<float> split_lse_for_rank(const std::vector<float>& global, int64_t heads, const LayoutView& layout,
                                      int cp, int rank, CpLayout cp_layout) {
  const int64_t rows = layout.total_rows(), local_rows = rows / cp;
  std::vector<float> local(static_cast<size_t>(heads * local_rows));
  for (int64_t h = 0; h < heads; ++h) {
    thdcp::split_for_rank(global.data() + h * rows, local.data() + h * local_rows, sizeof(float), layout, cp, rank,
                          cp_layout);
  }
  return local;
}

void merge_lse_from_rank(const std::vector<float>& local, std::vector<float>& global, int64_t heads,
                         const LayoutView& layout, int cp, int rank, CpLayout cp_layout) {
  const int64_t rows = layout.total_rows(), local_rows = rows / cp;
  for (int64_t h = 0; h < heads; ++h) {
    thdcp::merge_from_rank(local.data() + h * local_rows, global.data() + h * rows, sizeof(float), layout, cp, rank,
                           cp_layout);
  }
}

}  // namespace thdcp::tools
