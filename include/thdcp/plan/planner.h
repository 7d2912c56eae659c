// Capacity planning for CUDA graphs over packed batches (DESIGN.md section 7): from the
// documents of many batches, which `max_seqs` should graphs be captured for, how often would
// a batch fall back to eager, what does the fixed-capacity metadata cost, how much padding
// does the 2*cp alignment add, how evenly does the dual-chunk split share causal work, and
// which CP layout (dual_chunk or contiguous) costs less padding and balances each mask better.
//
// Definitions used throughout (and printed by `thdcp plan`):
// - Packing (pack_documents): documents are taken in file order and appended to the current
//   batch while its rows, each document padded to a multiple of `alignment`, stay <= tokens;
//   the next document that does not fit starts a new batch. plan_capacity's callers pack
//   once with alignment = packing_alignment(cp_sizes) = lcm(2*cp), so every CP size sees the
//   same batches (the same documents per batch) and every batch fits `tokens` rows under
//   every CP size (padding to a multiple of 2*cp never exceeds padding to a multiple of the
//   lcm). The per-CP padding numbers are then computed with that CP size's own 2*cp.
// - Percentiles are nearest-rank: P_p of n sorted values is the value of rank
//   ceil(p * n / 100) (1-based), i.e. the smallest value with at least p% of the
//   observations at or below it. P100 is the maximum.
// - A capacity of max_seqs holds max_seqs - 1 real sequences (one placeholder is always
//   reserved, DESIGN.md section 1), so the candidate for "P90" is max_seqs = P90 + 1 and a
//   batch falls back to eager when it has more than max_seqs - 1 documents.
// - Metadata bytes per rank of a capacity: cu_seqlens and cu_seqlens_padded, int32, max_seqs + 1
//   entries each, plus the CP segment table, 2 * max_seqs entries of sizeof(Segment):
//       2 * (max_seqs + 1) * 4 + 2 * max_seqs * sizeof(Segment)
//   (the CP path builds two segments per sequence for every cp, cp = 1 included).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/plan/layout_balance.h"
#include "thdcp/plan/mask.h"

namespace thdcp {

// Document lengths in order, with where each came from (for error messages).
struct DocumentLengths {
  std::string source;            // file path, or a description such as "--lengths"
  std::vector<int64_t> lengths;  // tokens of each document, >= 1
  std::vector<int64_t> lines;    // 1-based line in `source` of each length; empty: not from a file
};

// Batches of documents, with where each batch came from.
struct DocumentBatches {
  std::string source;
  std::vector<std::vector<int64_t>> batches;  // document lengths (tokens, >= 1) of each batch
  std::vector<int64_t> lines;  // 1-based line in `source` of each batch (for packed batches: the
                               // line of its first document); empty: not from a file
};

// Limits of the text inputs (lengths and batches files).
constexpr uintmax_t kMaxTextInputBytes = uintmax_t{256} << 20;  // 256 MiB
constexpr size_t kMaxTextLineBytes = 1 << 16;                   // 64 KiB per line

// Checks that `path` names a regular file (not a directory, FIFO, socket or device, which
// could block or never end) of at most `max_bytes` bytes, before anything opens it. Throws
// thdcp::Error naming the path, what it is and the limit. `what` names the input ("lengths").
void check_input_file(const std::string& path, const char* what, uintmax_t max_bytes);

// Reads a lengths file: one document length (decimal digits, optional leading '+', >= 1) per
// line; blank lines and text from '#' to the end of a line are ignored; surrounding spaces are
// allowed. At most kMaxTextInputBytes bytes and kMaxTextLineBytes per line; values are quoted
// in messages as short escaped excerpts (quote_excerpt).
// Zero is rejected: an empty document would take a capacity slot without any token, and is
// almost always a data-preparation bug. Throws thdcp::Error naming path:line and the bad text
// (missing file, negative, zero, non-numeric, too large, or no lengths at all).
DocumentLengths read_lengths_file(const std::string& path);

// Reads a batches file: one batch per line, its document lengths (integers >= 1) separated by
// spaces, tabs or commas; blank lines and '#' comments are ignored (a blank line is not an
// empty batch). Errors as for read_lengths_file.
DocumentBatches read_batches_file(const std::string& path);

// Least common multiple of 2*cp over `cp_sizes` (each >= 1): the alignment to pack with so
// that the batches fit under every CP size. Throws if the list is empty or the lcm overflows.
int64_t packing_alignment(const std::vector<int>& cp_sizes);

// Packs documents in order into batches of at most `tokens` rows, each document padded to a
// multiple of `alignment` (see the definition at the top of this file).
//   documents  lengths in order (every length >= 1)
//   tokens     rows per batch (the capacity's max_tokens), >= alignment
//   alignment  rows each document is padded to a multiple of, >= 1 (packing_alignment())
// Throws thdcp::Error naming the document (source:line when known) when one does not fit a
// batch on its own, and what to change (raise tokens).
DocumentBatches pack_documents(const DocumentLengths& documents, int64_t tokens, int64_t alignment);

// The documents of batch `index` of pack_documents(documents, tokens, alignment), without
// building the other batches; empty when there is no such batch. `count` (optional) receives
// how many batches there are. Throws as pack_documents does.
std::vector<int64_t> packed_batch(const DocumentLengths& documents, int64_t tokens, int64_t alignment, int64_t index,
                                  int64_t* count);

// What to do with a document longer than a batch (more than the largest multiple of
// `alignment` that is <= tokens): refuse it (pack_documents names it), split it into pieces
// of that many tokens (the last one shorter), or cut it to that many tokens.
enum class LongDocuments { kError, kSplit, kTruncate };
// The documents with that policy applied (kError: unchanged); `touched` (optional) receives
// how many documents were split or cut. Pieces keep their document's line.
DocumentLengths fit_long_documents(const DocumentLengths& documents, int64_t tokens, int64_t alignment,
                                   LongDocuments policy, int64_t* touched = nullptr);

// How many documents and batches packing makes, counted without building them: documents
// after `policy` (a split document counts once per piece) and the batches pack_documents makes
// of those (a document that does not fit, under kError, counts as a batch of its own:
// pack_documents refuses it). O(number of documents), whatever the pieces; allocates nothing.
struct PackingSize {
  int64_t documents = 0;  // after the policy
  int64_t batches = 0;
  int64_t touched = 0;    // documents split or truncated
};
PackingSize count_packing(const DocumentLengths& documents, int64_t tokens, int64_t alignment, LongDocuments policy);

// The batches and documents of a batches file, counted (every value checked as
// read_batches_file checks it) without storing them: its size before it is read.
PackingSize count_batches_file(const std::string& path);

// Upper estimate of the bytes the planner holds at its peak for `size`, from
// fit_long_documents through pack_documents to plan_capacity (the read lengths, the fitted
// documents, the batches with their allocator overhead, plan_capacity's per-batch counts),
// beyond `read_bytes`, what the input already takes (the read lengths; 0 for batches files,
// which are the batches). In double: no overflow.
double planning_bytes(const PackingSize& size, double read_bytes);

// The bytes `documents` takes (its vectors' capacities).
double document_bytes(const DocumentLengths& documents);

// Smallest `tokens` that holds every batch under every CP size in `cp_sizes`: the largest
// padded batch, rounded up to packing_alignment(cp_sizes). Useful as a default for batch files.
// Throws thdcp::Error naming a batch that needs more than 2^31-1 rows (no tokens holds it).
int64_t min_tokens_for(const DocumentBatches& batches, const std::vector<int>& cp_sizes);

// Nearest-rank percentile (see above) of `values`, p in (0, 100]. Throws if values is empty.
int64_t percentile_nearest_rank(std::vector<int64_t> values, int p);

// Bytes of fixed-capacity metadata per rank for `max_seqs` (formula above), max_seqs in
// [1, 2^31] (a batch of at most 2^31-1 rows, plus the placeholder).
int64_t capacity_metadata_bytes(int64_t max_seqs);

struct PlanOptions {
  int64_t tokens = 0;                   // rows per batch (max_tokens), in [1, 2^31-1] (int32 offsets)
  std::vector<int> cp_sizes{1, 2, 4, 8};  // CP sizes to plan for, each >= 1, no duplicates
  Mask mask = Mask::causal();           // mask of the pair balance (causal by default)
  // Masks the CP layouts are compared under (CpPlan::layouts), each checked by check_mask.
  std::vector<Mask> layout_masks{Mask::causal(), Mask::full()};
  double fallback_budget = 0.01;        // largest fallback fraction the recommendation accepts
};

// Distribution of documents per batch (nearest-rank percentiles).
struct DocsPerBatch {
  int64_t batches = 0;
  double mean = 0;
  int64_t p50 = 0, p90 = 0, p99 = 0, max = 0;
  std::vector<int64_t> counts;  // documents of each batch, in batch order (for histograms)
};

// One candidate capacity and what it costs.
struct CapacityCandidate {
  std::string label;             // "P90", "P99", "max" or "T/(2cp)"
  int64_t max_seqs = 0;          // the capacity: label's document count + 1
  int64_t fallback_batches = 0;  // batches with more than max_seqs - 1 documents
  double fallback_fraction = 0;  // fallback_batches / batches
  int64_t metadata_bytes = 0;    // capacity_metadata_bytes(max_seqs), per rank
};

struct CpPlan {
  int cp = 1;
  int64_t valid_tokens = 0;         // sum of document lengths over all batches
  int64_t padded_rows = 0;          // sum of their lengths padded to multiples of 2*cp
  double padding_fraction = 0;      // (padded_rows - valid_tokens) / padded_rows
  double slack_fraction = 0;        // rows of the batches (batches * tokens) no document uses
  int64_t longest_document = 0;     // tokens
  int64_t longest_rows_per_rank = 0;  // its padded length / cp: rows it puts on every rank
  std::vector<CapacityCandidate> candidates;  // P90, P99, max, T/(2cp), in this order
  RankBalance balance;              // the dual-chunk split under PlanOptions::mask
  // Both CP layouts' padding and balance under each of PlanOptions::layout_masks, over the
  // same batches, and the layout recommended for each mask (layout_balance.h).
  LayoutComparison layouts;
  // Index into candidates of the recommendation: the smallest candidate whose fallback
  // fraction is <= PlanOptions::fallback_budget; but T/(2cp) when it is at most twice that
  // one, because it never falls back whatever the data and costs little more.
  int recommended = 0;
  std::string reason;               // one line: why that candidate
};

struct CapacityPlan {
  int64_t tokens = 0;
  int64_t packing_alignment = 0;  // informational: lcm(2*cp), what pack_documents used for lengths
  DocsPerBatch docs_per_batch;    // the same for every CP size (the batches are shared)
  std::vector<Mask> layout_masks;  // PlanOptions::layout_masks: what CpPlan::layouts' balances are under
  std::vector<CpPlan> per_cp;     // in the order of PlanOptions::cp_sizes
};

// Plans capacities for `batches` (from read_batches_file or pack_documents). Every batch must
// fit options.tokens rows under every CP size; a batch that does not is reported with its
// source line. Throws thdcp::Error on invalid options or input.
CapacityPlan plan_capacity(const DocumentBatches& batches, const PlanOptions& options);

}  // namespace thdcp
