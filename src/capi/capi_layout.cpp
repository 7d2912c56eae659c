// Host arithmetic of the C ABI: the rank split of either CP layout (plan/rank_split.h), capacities and
// layouts (plan/capacity.h, plan/layout.h) and capacity planning (plan/planner.h).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <vector>

#include <unistd.h>

#include "capi_convert.h"
#include "capi_status.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/planner.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp::capi {

namespace {

// A host layout for the split helpers, its values checked for `cp_layout` (every padded
// length a multiple of 2 * cp, or the rows a multiple of cp).
LayoutView split_layout(const thdcp_layout_t* layout, int cp, int rank, CpLayout cp_layout) {
  THDCP_CAPI_REQUIRE(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CAPI_REQUIRE(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  const LayoutView batch = layout_view(layout, "layout");
  validate_cp_layout(batch, batch.total_rows(), cp, cp_layout);
  return batch;
}

// Which way rows move between a global tensor and a rank's local one.
enum class Move { kSplit /* global -> local */, kMerge /* local -> global */ };

// The row map of a split or merge of `rank`, after every check and before anything is
// allocated: both buffers given, the layout valid, row_bytes times the rows of each side a
// valid byte count, and the two buffers apart (neither operation works in place: rows are
// read and written in different orders).
std::vector<int32_t> move_map(Move move, const void* global, const void* local, size_t row_bytes,
                              const thdcp_layout_t* layout, int cp, int rank, CpLayout cp_layout) {
  const bool split = move == Move::kSplit;
  const char* read = split ? "global" : "local";
  const char* written = split ? "local" : "global";
  THDCP_CAPI_REQUIRE((split ? global : local) != nullptr, read << " is NULL: pass its host memory");
  THDCP_CAPI_REQUIRE((split ? local : global) != nullptr, written << " is NULL: pass its host memory");
  THDCP_CAPI_REQUIRE(row_bytes >= 1, "row_bytes=0: pass the bytes of one row (heads * head_dim * element size)");
  const LayoutView batch = split_layout(layout, cp, rank, cp_layout);
  const int64_t rows = batch.total_rows();
  size_t global_bytes = 0;
  THDCP_CAPI_REQUIRE(row_bytes <= static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max()) &&
                         !__builtin_mul_overflow(static_cast<size_t>(rows), row_bytes, &global_bytes) &&
                         global_bytes <= static_cast<size_t>(std::numeric_limits<ptrdiff_t>::max()),
                     "row_bytes=" << row_bytes << " times the layout's T=" << rows
                                  << " rows is more than the largest byte count (2^63-1): row_bytes is the bytes of "
                                     "one row (heads * head_dim * element size)");
  const size_t local_bytes = static_cast<size_t>(rows / cp) * row_bytes;
  const auto global_begin = reinterpret_cast<uintptr_t>(global), local_begin = reinterpret_cast<uintptr_t>(local);
  uintptr_t global_end = 0, local_end = 0;
  THDCP_CAPI_REQUIRE(!__builtin_add_overflow(global_begin, global_bytes, &global_end) &&
                         !__builtin_add_overflow(local_begin, local_bytes, &local_end),
                     "global=" << global << " of " << global_bytes << " bytes or local=" << local << " of "
                               << local_bytes << " bytes runs past the end of the address space: check row_bytes="
                               << row_bytes);
  const bool apart = global_bytes == 0 || global_end <= local_begin || local_end <= global_begin;
  THDCP_CAPI_REQUIRE(apart, read << "=" << (split ? global : local) << " (" << (split ? global_bytes : local_bytes)
                                 << " bytes) and " << written << "=" << (split ? local : global) << " ("
                                 << (split ? local_bytes : global_bytes) << " bytes) overlap: rows are read from "
                                 << read << " while others are written to " << written
                                 << ", so the two may not share memory; pass separate buffers");
  return rank_row_map(batch, cp, rank, cp_layout);
}

void local_rows(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows, int64_t num_rows,
                CpLayout cp_layout) {
  // The layout's values first, then the output's size, then the map: nothing is allocated
  // for a count the caller's array does not have.
  const LayoutView batch = split_layout(layout, cp, rank, cp_layout);
  const int64_t rows = batch.total_rows() / cp;
  THDCP_CAPI_NOT_NULL(global_rows, "num_rows = T / cp = " << rows << " int32 entries");
  THDCP_CAPI_REQUIRE(num_rows == rows, "num_rows=" << num_rows << " but rank " << rank << " of cp=" << cp
                                                   << " holds T / cp = " << rows << " rows of this layout (T = "
                                                   << batch.total_rows() << ")");
  const std::vector<int32_t> map = rank_row_map(batch, cp, rank, cp_layout);
  std::copy(map.begin(), map.end(), global_rows);
}

void split(const void* global, void* local, size_t row_bytes, const thdcp_layout_t* layout, int cp, int rank,
           CpLayout cp_layout) {
  gather_rows(global, local, move_map(Move::kSplit, global, local, row_bytes, layout, cp, rank, cp_layout),
              row_bytes);
}

void merge(const void* local, void* global, size_t row_bytes, const thdcp_layout_t* layout, int cp, int rank,
           CpLayout cp_layout) {
  scatter_rows(local, global, move_map(Move::kMerge, global, local, row_bytes, layout, cp, rank, cp_layout),
               row_bytes);
}

// The trailing thdcp_cp_layout_t of the _ex helpers.
// By reference: the argument's bytes are read (raw_enum), never loaded as the enum, which a C
// caller may have given any int.
CpLayout layout_argument(const thdcp_cp_layout_t& cp_layout) { return cp_layout_of(raw_enum(cp_layout), "cp_layout"); }

Capacity capacity_of(const thdcp_capacity_t* capacity) {
  THDCP_CAPI_NOT_NULL(capacity, "a thdcp_capacity_t (max_tokens, max_seqs)");
  return Capacity{capacity->max_seqs, capacity->max_tokens};
}

thdcp_capacity_t c_capacity(const Capacity& capacity) {
  thdcp_capacity_t out{};
  out.max_tokens = capacity.max_tokens;
  out.max_seqs = capacity.max_seqs;
  return out;
}

void copy_layout(const BatchLayout& layout, int32_t* cu_seqlens, int32_t* cu_seqlens_padded) {
  std::copy(layout.cu_seqlens.begin(), layout.cu_seqlens.end(), cu_seqlens);
  std::copy(layout.cu_seqlens_padded.begin(), layout.cu_seqlens_padded.end(), cu_seqlens_padded);
}

const thdcp_capacity_plan_params kPlanDefaults = THDCP_CAPACITY_PLAN_PARAMS_INIT;

// The host's physical memory in bytes (the planner's default budget).
double physical_memory() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

}  // namespace

}  // namespace thdcp::capi

using thdcp::capi::guarded;

extern "C" {

thdcp_status_t thdcp_cp_local_rows(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                   int64_t num_rows) {
  return guarded(__func__, [&] {
    thdcp::capi::local_rows(layout, cp, rank, global_rows, num_rows, thdcp::CpLayout::kDualChunk);
  });
}

thdcp_status_t thdcp_cp_local_rows_ex(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                      int64_t num_rows, thdcp_cp_layout_t cp_layout) {
  return guarded(__func__, [&] {
    thdcp::capi::local_rows(layout, cp, rank, global_rows, num_rows, thdcp::capi::layout_argument(cp_layout));
  });
}

thdcp_status_t thdcp_cp_split(const void* global, void* local, size_t row_bytes, const thdcp_layout_t* layout,
                              int cp, int rank) {
  return guarded(__func__, [&] {
    thdcp::capi::split(global, local, row_bytes, layout, cp, rank, thdcp::CpLayout::kDualChunk);
  });
}

thdcp_status_t thdcp_cp_split_ex(const void* global, void* local, size_t row_bytes, const thdcp_layout_t* layout,
                                 int cp, int rank, thdcp_cp_layout_t cp_layout) {
  return guarded(__func__, [&] {
    thdcp::capi::split(global, local, row_bytes, layout, cp, rank, thdcp::capi::layout_argument(cp_layout));
  });
}

thdcp_status_t thdcp_cp_merge(const void* local, void* global, size_t row_bytes, const thdcp_layout_t* layout,
                              int cp, int rank) {
  return guarded(__func__, [&] {
    thdcp::capi::merge(local, global, row_bytes, layout, cp, rank, thdcp::CpLayout::kDualChunk);
  });
}

thdcp_status_t thdcp_cp_merge_ex(const void* local, void* global, size_t row_bytes, const thdcp_layout_t* layout,
                                 int cp, int rank, thdcp_cp_layout_t cp_layout) {
  return guarded(__func__, [&] {
    thdcp::capi::merge(local, global, row_bytes, layout, cp, rank, thdcp::capi::layout_argument(cp_layout));
  });
}

thdcp_status_t thdcp_capacity_default(int64_t max_tokens, int cp, thdcp_capacity_t* capacity) {
  return guarded(__func__, [&] {
    const thdcp::Capacity made = thdcp::default_capacity(max_tokens, cp);
    THDCP_CAPI_NOT_NULL(capacity, "a thdcp_capacity_t to receive the capacity");
    *capacity = thdcp::capi::c_capacity(made);
  });
}

thdcp_status_t thdcp_capacity_check_fit(const int64_t* lengths, int64_t num_documents, int cp,
                                        const thdcp_capacity_t* capacity, thdcp_fit_t* fit) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    thdcp::capi::checked_padded_rows(docs, cp, "lengths");
    const thdcp::Fit result = thdcp::check_fit(docs, cp, thdcp::capi::capacity_of(capacity));
    THDCP_CAPI_NOT_NULL(fit, "a thdcp_fit_t to receive the answer");
    switch (result) {
      case thdcp::Fit::kFits: *fit = THDCP_FIT_FITS; return;
      case thdcp::Fit::kTooManySequences: *fit = THDCP_FIT_TOO_MANY_SEQUENCES; return;
      case thdcp::Fit::kTooManyTokens: *fit = THDCP_FIT_TOO_MANY_TOKENS; return;
    }
  });
}

thdcp_status_t thdcp_padded_rows(const int64_t* lengths, int64_t num_documents, int cp, int64_t* rows) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    thdcp::capi::checked_padded_rows(docs, cp, "lengths");
    THDCP_CAPI_NOT_NULL(rows, "an int64_t to receive the rows");
    *rows = thdcp::padded_rows(docs, cp);
  });
}

thdcp_status_t thdcp_make_layout(const int64_t* lengths, int64_t num_documents, int cp, int32_t* cu_seqlens,
                                 int32_t* cu_seqlens_padded) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    thdcp::capi::checked_padded_rows(docs, cp, "lengths");
    THDCP_CAPI_NOT_NULL(cu_seqlens, "num_documents + 1 = " << num_documents + 1 << " int32 entries");
    THDCP_CAPI_NOT_NULL(cu_seqlens_padded, "num_documents + 1 = " << num_documents + 1 << " int32 entries");
    thdcp::capi::copy_layout(thdcp::make_layout(docs, cp), cu_seqlens, cu_seqlens_padded);
  });
}

thdcp_status_t thdcp_make_contiguous_layout(const int64_t* lengths, int64_t num_documents, int cp,
                                            int32_t* cu_seqlens, int32_t* cu_seqlens_padded) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    // Padding to 2*cp bounds the rows of any layout of these documents: past it, no sum overflows.
    thdcp::capi::checked_padded_rows(docs, cp, "lengths");
    THDCP_CAPI_REQUIRE(num_documents >= 1,
                       "num_documents=0: pass at least one document (the last one takes the padding to a multiple "
                       "of cp rows)");
    const thdcp::BatchLayout made = thdcp::make_contiguous_layout(docs, cp);
    THDCP_CAPI_NOT_NULL(cu_seqlens, "num_documents + 1 = " << num_documents + 1 << " int32 entries");
    THDCP_CAPI_NOT_NULL(cu_seqlens_padded, "num_documents + 1 = " << num_documents + 1 << " int32 entries");
    thdcp::capi::copy_layout(made, cu_seqlens, cu_seqlens_padded);
  });
}

thdcp_status_t thdcp_capacity_layout(const int64_t* lengths, int64_t num_documents, int cp,
                                     const thdcp_capacity_t* capacity, int32_t* cu_seqlens,
                                     int32_t* cu_seqlens_padded) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    thdcp::capi::checked_padded_rows(docs, cp, "lengths");
    const thdcp::Capacity cap = thdcp::capi::capacity_of(capacity);
    THDCP_CAPI_NOT_NULL(cu_seqlens, "capacity->max_seqs + 1 int32 entries");
    THDCP_CAPI_NOT_NULL(cu_seqlens_padded, "capacity->max_seqs + 1 int32 entries");
    thdcp::capi::copy_layout(thdcp::capacity_layout(docs, cp, cap), cu_seqlens, cu_seqlens_padded);
  });
}

thdcp_status_t thdcp_choose_cp_size(const int64_t* lengths, int64_t num_documents, const int32_t* cp_sizes,
                                    int num_sizes, int64_t rows_per_rank, int32_t* cp_size) {
  return guarded(__func__, [&] {
    const std::vector<int64_t> docs = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    THDCP_CAPI_REQUIRE(num_sizes >= 1, "num_sizes=" << num_sizes << " must be >= 1");
    THDCP_CAPI_NOT_NULL(cp_sizes, "num_sizes=" << num_sizes << " CP sizes");
    THDCP_CAPI_NOT_NULL(cp_size, "an int32_t to receive the CP size");
    THDCP_CAPI_REQUIRE(rows_per_rank >= 1, "rows_per_rank=" << rows_per_rank << " must be >= 1");
    const std::vector<int> sizes(cp_sizes, cp_sizes + num_sizes);
    for (int i = 0; i < num_sizes; ++i) {
      THDCP_CAPI_REQUIRE(sizes[i] >= 1, "cp_sizes[" << i << "]=" << sizes[i] << " must be >= 1");
      int64_t budget = 0;
      THDCP_CAPI_REQUIRE(thdcp::capi::multiply(rows_per_rank, sizes[i], &budget),
                         "rows_per_rank=" << rows_per_rank << " times cp_sizes[" << i << "]=" << sizes[i]
                                          << " overflows 64 bits: pass the rows one rank holds");
      thdcp::capi::checked_padded_rows(docs, sizes[i], "lengths");
    }
    *cp_size = thdcp::choose_cp_size(docs, sizes, rows_per_rank);
  });
}

thdcp_status_t thdcp_plan_capacity(const int64_t* lengths, int64_t num_documents,
                                   const thdcp_capacity_plan_params* params, thdcp_capacity_plan_result* result) {
  return guarded(__func__, [&] {
    const thdcp_capacity_plan_params p = thdcp::capi::read_params(
        params, THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE, thdcp::capi::kPlanDefaults, "params",
        "thdcp_capacity_plan_params", "THDCP_CAPACITY_PLAN_PARAMS_INIT or thdcp_capacity_plan_params_init()");
    thdcp::DocumentLengths documents;
    documents.source = "lengths";
    documents.lengths = thdcp::capi::lengths_of(lengths, num_documents, "lengths");
    THDCP_CAPI_REQUIRE(num_documents >= 1, "num_documents=0: pass at least one document length");
    for (int64_t i = 0; i < num_documents; ++i) {
      THDCP_CAPI_REQUIRE(lengths[i] >= 1,
                         "lengths[" << i << "]=" << lengths[i] << ": planning takes documents of >= 1 token");
    }
    THDCP_CAPI_REQUIRE(p.cp_size >= 1, "params->cp_size=" << p.cp_size << " must be >= 1");
    THDCP_CAPI_REQUIRE(p.long_documents >= 0 && p.long_documents <= 2,
                       "params->long_documents=" << p.long_documents
                                                 << ": use 0 (refuse), 1 (split) or 2 (cut to a batch)");
    THDCP_CAPI_REQUIRE(p.fallback_budget >= 0.0 && p.fallback_budget <= 1.0,
                       "params->fallback_budget=" << p.fallback_budget << " must be a fraction in [0, 1]");
    THDCP_CAPI_REQUIRE(p.tokens >= 2 * static_cast<int64_t>(p.cp_size) &&
                           p.tokens <= std::numeric_limits<int32_t>::max(),
                       "params->tokens=" << p.tokens << " must be in [2*cp_size=" << 2 * static_cast<int64_t>(p.cp_size)
                                         << ", 2^31): the rows of a batch, which a layout's int32 offsets index");
    thdcp::capi::checked_padded_rows(documents.lengths, p.cp_size, "lengths");
    THDCP_CAPI_REQUIRE(p.max_memory >= 0, "params->max_memory=" << p.max_memory
                                                                  << " must be >= 0 (0: this machine's memory)");
    const int64_t alignment = thdcp::packing_alignment({p.cp_size});
    const auto policy = static_cast<thdcp::LongDocuments>(p.long_documents);
    // What planning makes, counted before any of it is made: the documents after splitting
    // (a layout indexes at most 2^31-1) and the memory the planner holds at its peak.
    const thdcp::PackingSize size = thdcp::count_packing(documents, p.tokens, alignment, policy);
    THDCP_CAPI_REQUIRE(size.documents <= std::numeric_limits<int32_t>::max(),
                       "lengths split into pieces of at most " << p.tokens / alignment * alignment
                                                               << " tokens (params->tokens=" << p.tokens
                                                               << ") make more than 2^31-1 documents: raise "
                                                                  "tokens, or plan fewer documents at a time");
    const double needed = thdcp::planning_bytes(size, thdcp::document_bytes(documents));
    const double budget = p.max_memory > 0 ? static_cast<double>(p.max_memory) : thdcp::capi::physical_memory();
    if (needed > budget) {
      std::ostringstream message;
      message << "planning these lengths needs about " << needed / (1 << 20) << " MiB of host memory ("
              << size.documents << " documents in " << size.batches << " batches), more than "
              << (p.max_memory > 0 ? "params->max_memory=" : "this machine's memory, ") << budget / (1 << 20)
              << " MiB: raise params->tokens, cut long documents (long_documents=2) instead of splitting them, "
                 "or plan fewer documents at a time";
      throw thdcp::capi::ApiError(THDCP_ERROR_OUT_OF_MEMORY, message.str());
    }
    const thdcp::DocumentLengths fitted = thdcp::fit_long_documents(documents, p.tokens, alignment, policy);
    thdcp::PlanOptions options;
    options.tokens = p.tokens;
    options.cp_sizes = {p.cp_size};
    options.fallback_budget = p.fallback_budget;
    const thdcp::CapacityPlan plan =
        thdcp::plan_capacity(thdcp::pack_documents(fitted, p.tokens, alignment), options);
    const thdcp::CpPlan& per_cp = plan.per_cp.at(0);
    const thdcp::CapacityCandidate& chosen = per_cp.candidates.at(static_cast<size_t>(per_cp.recommended));
    THDCP_CAPI_REQUIRE(chosen.max_seqs <= std::numeric_limits<int32_t>::max(),
                       "the recommended max_seqs=" << chosen.max_seqs << " does not fit an int32");
    thdcp_capacity_plan_result out{};
    out.struct_size = sizeof(out);
    out.capacity.max_tokens = p.tokens;
    out.capacity.max_seqs = static_cast<int32_t>(chosen.max_seqs);
    out.batches = plan.docs_per_batch.batches;
    out.fallback_batches = chosen.fallback_batches;
    out.fallback_fraction = chosen.fallback_fraction;
    out.padding_fraction = per_cp.padding_fraction;
    out.metadata_bytes = chosen.metadata_bytes;
    thdcp::capi::write_result(result, out, THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE, "result",
                              "thdcp_capacity_plan_result");
  });
}

}  // extern "C"
