#include "thdcp/plan/layout.h"

#include <limits>

#include "thdcp/core/error.h"

namespace thdcp {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

void check_cp(int cp, const char* what) {
  THDCP_CHECK(cp >= 1, what << ": cp=" << cp << " must be >= 1 (1 means no context parallelism)");
}

// The capacity's own bounds, either layout.
void check_capacity_bounds(const Capacity& capacity) {
  THDCP_CHECK(capacity.max_seqs >= 1,
              "capacity.max_seqs=" << capacity.max_seqs << " must be >= 1 (one placeholder is reserved)");
  THDCP_CHECK(capacity.max_tokens >= 0 && capacity.max_tokens <= kInt32Max,
              "capacity.max_tokens=" << capacity.max_tokens << " must be in [0, 2^31-1]");
}

// The documents fit the capacity's sequences, one placeholder reserved.
void check_sequence_count(size_t documents, const Capacity& capacity) {
  THDCP_CHECK(static_cast<int64_t>(documents) <= capacity.max_seqs - 1,
              "the batch has " << documents << " sequences but capacity.max_seqs=" << capacity.max_seqs
                               << " holds at most " << capacity.max_seqs - 1
                               << " (one placeholder is reserved): raise max_seqs or split the batch");
}

// Zero-length placeholders up to max_seqs, the last absorbing the rows up to max_tokens.
void add_placeholders(BatchLayout& layout, const Capacity& capacity) {
  const int32_t valid = layout.cu_seqlens.back();
  const int32_t rows = layout.cu_seqlens_padded.back();
  while (layout.num_seqs() < capacity.max_seqs) {
    layout.cu_seqlens.push_back(valid);
    layout.cu_seqlens_padded.push_back(rows);
  }
  layout.cu_seqlens_padded.back() = static_cast<int32_t>(capacity.max_tokens);
}

}  // namespace

int64_t cp_padded_length(int64_t length, int cp) {
  check_cp(cp, "cp_padded_length");
  THDCP_CHECK(length >= 0, "sequence length " << length << " is negative");
  const int64_t align = 2 * static_cast<int64_t>(cp);
  THDCP_CHECK(length <= std::numeric_limits<int64_t>::max() - (align - 1),
              "sequence length " << length << " cannot be padded to a multiple of 2*cp=" << align
                                 << " in int64: no layout holds it (offsets are int32)");
  return (length + (align - 1)) / align * align;
}

BatchLayout make_layout(const std::vector<int64_t>& lengths, int cp) {
  check_cp(cp, "make_layout");
  BatchLayout layout;
  layout.cu_seqlens.reserve(lengths.size() + 1);
  layout.cu_seqlens_padded.reserve(lengths.size() + 1);
  layout.cu_seqlens.push_back(0);
  layout.cu_seqlens_padded.push_back(0);
  int64_t valid = 0;
  int64_t rows = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    THDCP_CHECK(lengths[b] >= 0, "lengths[" << b << "]=" << lengths[b]
                                            << " is negative: lengths count tokens");
    valid += lengths[b];
    rows += cp_padded_length(lengths[b], cp);
    THDCP_CHECK(rows <= kInt32Max, "the padded batch has " << rows
                                       << " rows, more than int32 offsets hold (2^31-1): "
                                          "split it into smaller batches");
    layout.cu_seqlens.push_back(static_cast<int32_t>(valid));
    layout.cu_seqlens_padded.push_back(static_cast<int32_t>(rows));
  }
  return layout;
}

BatchLayout make_contiguous_layout(const std::vector<int64_t>& lengths, int cp) {
  check_cp(cp, "make_contiguous_layout");
  THDCP_CHECK(!lengths.empty(), "make_contiguous_layout needs at least one length (the last one absorbs the padding)");
  BatchLayout layout = make_layout(lengths, 1);
  layout.cu_seqlens_padded = layout.cu_seqlens;
  const int64_t rows = (static_cast<int64_t>(layout.cu_seqlens.back()) + cp - 1) / cp * cp;
  THDCP_CHECK(rows <= kInt32Max, "the batch has " << rows << " rows, more than int32 offsets hold (2^31-1)");
  layout.cu_seqlens_padded.back() = static_cast<int32_t>(rows);
  return layout;
}

BatchLayout make_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity) {
  check_cp(cp, "make_layout");
  const int64_t align = 2 * static_cast<int64_t>(cp);
  check_capacity_bounds(capacity);
  THDCP_CHECK(capacity.max_tokens % align == 0,
              "capacity.max_tokens=" << capacity.max_tokens << " is not a multiple of 2*cp="
                                     << align << ": round it up to " << cp_padded_length(capacity.max_tokens, cp));
  check_sequence_count(lengths.size(), capacity);
  BatchLayout layout = make_layout(lengths, cp);
  THDCP_CHECK(layout.total_rows() <= capacity.max_tokens,
              "the batch needs " << layout.total_rows() << " rows after padding to multiples of 2*cp="
                                 << align << " but capacity.max_tokens=" << capacity.max_tokens
                                 << ": raise max_tokens or split the batch");
  add_placeholders(layout, capacity);
  return layout;
}

BatchLayout make_contiguous_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity) {
  check_cp(cp, "make_contiguous_layout");
  check_capacity_bounds(capacity);
  THDCP_CHECK(capacity.max_tokens % cp == 0,
              "capacity.max_tokens=" << capacity.max_tokens << " is not a multiple of cp=" << cp
                                     << " (the contiguous layout cuts the rows into cp equal pieces)");
  check_sequence_count(lengths.size(), capacity);
  BatchLayout layout = make_layout(lengths, 1);
  layout.cu_seqlens_padded = layout.cu_seqlens;
  THDCP_CHECK(layout.cu_seqlens.back() <= capacity.max_tokens,
              "the batch has " << layout.cu_seqlens.back() << " tokens but capacity.max_tokens="
                               << capacity.max_tokens << ": raise max_tokens or split the batch");
  add_placeholders(layout, capacity);
  return layout;
}

void validate_layout(const LayoutView& layout, int64_t total_rows, int cp) {
  THDCP_CHECK(cp >= 0, "cp=" << cp << " must be >= 1 (or 0 for a single-device call)");
  THDCP_CHECK(layout.num_seqs >= 1, "cu_seqlens has " << layout.num_seqs + 1
                                                      << " entries: it needs at least 2 (one sequence)");
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "cu_seqlens and cu_seqlens_padded must not be null");
  THDCP_CHECK(total_rows >= 0 && total_rows <= kInt32Max,
              "the tensors have " << total_rows << " rows: thdcp needs 0 <= T <= 2^31-1");
  const int32_t* cu = layout.cu_seqlens;
  const int32_t* cup = layout.cu_seqlens_padded;
  THDCP_CHECK(cu[0] == 0, "cu_seqlens[0]=" << cu[0] << " must be 0");
  THDCP_CHECK(cup[0] == 0, "cu_seqlens_padded[0]=" << cup[0] << " must be 0");
  const int64_t align = cp > 0 ? 2 * static_cast<int64_t>(cp) : 1;
  for (int b = 0; b < layout.num_seqs; ++b) {
    THDCP_CHECK(cu[b + 1] >= cu[b], "cu_seqlens[" << b + 1 << "]=" << cu[b + 1] << " is less than cu_seqlens["
                                                  << b << "]=" << cu[b] << ": offsets must not decrease");
    THDCP_CHECK(cup[b + 1] >= cup[b], "cu_seqlens_padded[" << b + 1 << "]=" << cup[b + 1]
                                                           << " is less than cu_seqlens_padded[" << b
                                                           << "]=" << cup[b] << ": offsets must not decrease");
    const int64_t length = static_cast<int64_t>(cu[b + 1]) - cu[b];
    const int64_t padded = static_cast<int64_t>(cup[b + 1]) - cup[b];
    THDCP_CHECK(padded >= length, "sequence " << b << " has " << length << " valid tokens (cu_seqlens) but only "
                                              << padded << " rows (cu_seqlens_padded): P_b must be >= L_b");
    THDCP_CHECK(padded % align == 0,
                "sequence " << b << ": padded length cu_seqlens_padded[" << b + 1 << "]-cu_seqlens_padded["
                            << b << "]=" << padded << " is not a multiple of 2*cp=" << align
                            << ": pad each sequence to a multiple of " << align << " (thdcp::make_layout)");
  }
  THDCP_CHECK(cup[layout.num_seqs] == total_rows,
              "cu_seqlens_padded[" << layout.num_seqs << "]=" << cup[layout.num_seqs]
                                   << " must equal the number of rows of the tensors, T=" << total_rows);
}

BatchLayout layout_from_int64(const std::vector<int64_t>& cu_seqlens,
                              const std::vector<int64_t>& cu_seqlens_padded) {
  THDCP_CHECK(cu_seqlens.size() == cu_seqlens_padded.size(),
              "cu_seqlens has " << cu_seqlens.size() << " entries but cu_seqlens_padded has "
                                << cu_seqlens_padded.size() << ": both need num_seqs + 1");
  BatchLayout layout;
  auto convert = [](const std::vector<int64_t>& in, std::vector<int32_t>& out, const char* name) {
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      THDCP_CHECK(in[i] >= 0 && in[i] <= kInt32Max,
                  name << "[" << i << "]=" << in[i] << " does not fit int32 offsets [0, 2^31-1]");
      out.push_back(static_cast<int32_t>(in[i]));
    }
  };
  convert(cu_seqlens, layout.cu_seqlens, "cu_seqlens");
  convert(cu_seqlens_padded, layout.cu_seqlens_padded, "cu_seqlens_padded");
  return layout;
}

}  // namespace thdcp
