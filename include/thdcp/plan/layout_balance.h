// What each CP layout (DESIGN.md sections 3 and 10) costs a batch: the padding rows it adds
// and the (query, key) pairs each rank's query rows hold under a mask. The capacity planner
// (planner.h, `thdcp plan`) compares the layouts with these numbers.
//
// - dual_chunk: every document padded to a multiple of 2*cp and cut into 2*cp chunks; rank r
//   holds chunks r and 2*cp-1-r of every document (dual_chunk.h). Padding: the sum over the
//   documents of what each needs to reach a multiple of 2*cp (cp = 1 pads to even lengths).
// - contiguous: documents back to back with no padding of their own, the buffer padded once
//   to T rows, a multiple of cp, and cut into cp pieces; rank r owns rows
//   [r*T/cp, (r+1)*T/cp), whatever documents they belong to. Padding: T minus the tokens.
//
// A rank's work is the number of (query, key) pairs of its valid query rows that the mask
// allows, each query seeing the keys of its own document (the whole document is gathered).
// Each piece of a document on a rank is counted in closed form (segment_pairs), so a batch
// costs O(documents * cp) whatever its lengths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/mask.h"

namespace thdcp {

// Both layouts (CpLayout, cp_layout_name: thdcp/plan/contiguous.h), in the order reports
// list them (the default first).
constexpr CpLayout kCpLayouts[] = {CpLayout::kDualChunk, CpLayout::kContiguous};

// One layout applied to one batch.
struct CpLayoutReport {
  CpLayout layout = CpLayout::kDualChunk;
  int64_t valid_tokens = 0;         // sum of the lengths
  int64_t padding_tokens = 0;       // rows the layout adds
  int64_t total_rows = 0;           // valid_tokens + padding_tokens: the batch's T
  std::vector<int64_t> rank_pairs;  // pairs of each rank's query rows (cp entries)
  int64_t total_pairs = 0;          // sum of rank_pairs: the same for every layout
  double balance = 1.0;             // max over ranks / mean over ranks (1.0: perfect, or no pairs)
};

// Both layouts (in kCpLayouts order) for a batch of documents.
//   lengths  tokens of each document, in buffer order, each >= 0
//   cp       CP size, >= 1
//   mask     the attention mask (check_mask)
// Throws thdcp::Error when an argument is out of range or the padded batch needs more than
// 2^31-1 rows (layouts' offsets are int32).
std::vector<CpLayoutReport> cp_layout_report(const std::vector<int64_t>& lengths, int cp, const Mask& mask);

// Pairs of each rank (cp entries) of one layout for one batch; arguments as above.
std::vector<int64_t> cp_layout_rank_pairs(const std::vector<int64_t>& lengths, int cp, CpLayout layout,
                                          const Mask& mask);

// Rows `layout` adds to a batch of `lengths` under `cp`.
int64_t cp_layout_padding(const std::vector<int64_t>& lengths, int cp, CpLayout layout);

// (query, key) pairs per rank of one layout and mask, over many batches.
struct RankBalance {
  std::vector<int64_t> rank_pairs;  // pairs of each rank summed over all batches (cp entries)
  int64_t total_pairs = 0;          // sum over ranks and batches
  // max/mean across ranks of rank_pairs: the imbalance left after many batches.
  double total_max_over_mean = 1.0;
  // sum over batches of the busiest rank's pairs / sum over batches of the mean: the slowdown
  // of a synchronous step, which waits for its busiest rank every batch (>= total_max_over_mean).
  // With one batch, that batch's max/mean: what a measured step's imbalance is compared with.
  double step_max_over_mean = 1.0;
  // The largest per-batch max/mean, and the batch it occurs in.
  double worst_batch_max_over_mean = 1.0;
  int64_t worst_batch = 0;
};

// The balance of `layout` under `mask` over `batches` (each a list of document lengths).
RankBalance rank_balance(const std::vector<std::vector<int64_t>>& batches, int cp, CpLayout layout,
                         const Mask& mask);

// One layout at one CP size over many batches.
struct LayoutPlan {
  CpLayout layout = CpLayout::kDualChunk;
  int64_t padding_rows = 0;          // rows the layout adds, summed over the batches
  double padding_fraction = 0;       // padding_rows / valid tokens
  std::vector<RankBalance> balance;  // one per mask, in the order of the masks given
};

// Which layout to use for one mask, and why (one line).
struct LayoutChoice {
  CpLayout layout = CpLayout::kDualChunk;
  std::string reason;
};

// Relative difference of busiest-rank work under which two layouts count as tied.
constexpr double kLayoutTie = 0.01;

// Both layouts (kCpLayouts order) under every mask of `masks` over `batches`, and for each
// mask the recommendation: the layout whose busiest rank does the least work per step
// (RankBalance::step_max_over_mean: every layout has the same total pairs); within kLayoutTie
// of each other, the one with less padding (dual_chunk when equal).
struct LayoutComparison {
  std::vector<LayoutPlan> layouts;
  std::vector<LayoutChoice> choices;  // one per mask
};
LayoutComparison compare_layouts(const std::vector<std::vector<int64_t>>& batches, int cp,
                                 const std::vector<Mask>& masks);

}  // namespace thdcp
