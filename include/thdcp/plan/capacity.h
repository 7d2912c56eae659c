// Capacities of captured graphs (DESIGN.md sections 1 and 7): which capacity a batch fits,
// the default that makes the document count irrelevant, buckets, and the CP-size policy.
// Pure host arithmetic: the graph part calls it, the CPU tests check it.
//
// Every function takes the CP layout the batch is split by (thdcp/plan/contiguous.h; the
// dual-chunk one by default): under the dual-chunk layout each document is padded to a
// multiple of 2*cp and max_tokens is a multiple of 2*cp; under the contiguous one documents
// take their own length in rows and max_tokens is a multiple of cp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"

namespace thdcp {

// max_tokens / (2*cp) + 1: every document with at least one token takes at least 2*cp
// rows, so any batch whose padded rows fit max_tokens has at most max_tokens / (2*cp) such
// documents, and one placeholder is reserved on top. With this max_seqs the document count
// never forces a fallback. max_tokens must be a positive multiple of 2*cp.
// Contiguous: max_tokens + 1 (a document takes at least one row).
int default_max_seqs(int64_t max_tokens, int cp, CpLayout layout = CpLayout::kDualChunk);

// The capacity (default_max_seqs(max_tokens, cp, layout), max_tokens).
Capacity default_capacity(int64_t max_tokens, int cp, CpLayout layout = CpLayout::kDualChunk);

enum class Fit {
  kFits,
  kTooManySequences,  // the padded rows fit but the documents exceed max_seqs - 1
  kTooManyTokens,     // the padded rows exceed max_tokens
};
const char* fit_name(Fit fit);  // "fits", "too many sequences", "too many tokens"

// Documents of zero length take no row and are not counted (they are dropped from the
// static layout: no row changes meaning). Lengths must be >= 0.
Fit check_fit(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity,
              CpLayout layout = CpLayout::kDualChunk);

// Padded rows of the batch at this cp (each length padded to a multiple of 2*cp; contiguous:
// the lengths' sum).
int64_t padded_rows(const std::vector<int64_t>& lengths, int cp, CpLayout layout = CpLayout::kDualChunk);

// The capacity-form layout of a batch that fits (zero-length documents dropped); throws
// thdcp::Error naming the limit otherwise.
BatchLayout capacity_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity,
                            CpLayout layout = CpLayout::kDualChunk);

// Index of the capacity with the fewest max_tokens (then max_seqs) that the batch fits, or
// -1 when it fits none.
int smallest_fitting(const std::vector<Capacity>& buckets, const std::vector<int64_t>& lengths, int cp,
                     CpLayout layout = CpLayout::kDualChunk);

// Which capacity a graph bank runs a batch at (DESIGN.md section 7), the one rule of the C++
// GraphBank and the PyTorch package's: the smallest bucket the batch fits runs it (a graph);
// a batch whose padded rows fit a bucket but whose documents fit none runs eagerly on the
// zero-fallback capacity of the smallest bucket its rows fit, and is counted against that
// bucket (a fallback).
struct CapacityChoice {
  Capacity bucket;        // the bucket the batch is counted against
  Capacity run;           // what the step runs at: `bucket`, or default_capacity(bucket.max_tokens)
  bool fallback = false;  // the documents fit no bucket whose rows they fit
};

// Throws thdcp::Error, naming the batch's rows and the largest bucket, when its padded rows
// fit no bucket (or there is none).
CapacityChoice choose_capacity(const std::vector<Capacity>& buckets, const std::vector<int64_t>& lengths, int cp,
                               CpLayout layout = CpLayout::kDualChunk);

// The CP-size policy of dynamic CP: the smallest size in `sizes` whose rows per rank
// (padded_rows(lengths, c) / c) are at most `rows_per_rank`. Throws when none is, naming the
// batch's rows and the largest size. `sizes` must be >= 1 each.
int choose_cp_size(const std::vector<int64_t>& lengths, const std::vector<int>& sizes, int64_t rows_per_rank,
                   CpLayout layout = CpLayout::kDualChunk);

// Capacities order by max_tokens, then max_seqs (map keys, "the smallest bucket").
inline bool operator==(const Capacity& a, const Capacity& b) {
  return a.max_seqs == b.max_seqs && a.max_tokens == b.max_tokens;
}
inline bool operator!=(const Capacity& a, const Capacity& b) { return !(a == b); }
inline bool operator<(const Capacity& a, const Capacity& b) {
  return a.max_tokens != b.max_tokens ? a.max_tokens < b.max_tokens : a.max_seqs < b.max_seqs;
}

// "cp=2 max_seqs=4097 max_tokens=16384": the name of a graph key in messages and reports.
std::string capacity_key_name(int cp, const Capacity& capacity);

}  // namespace thdcp
