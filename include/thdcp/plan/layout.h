// Batch layouts: cu_seqlens / cu_seqlens_padded, their validation, CP padding and
// fixed-capacity layouts with placeholder sequences (DESIGN.md section 1).
#pragma once

#include <cstdint>
#include <vector>

namespace thdcp {

// A borrowed view of a batch's offsets. Both arrays have num_seqs + 1 entries.
struct LayoutView {
  const int32_t* cu_seqlens = nullptr;         // prefix sums of valid lengths L_b
  const int32_t* cu_seqlens_padded = nullptr;  // prefix sums of padded lengths P_b (memory)
  int num_seqs = 0;

  int64_t total_rows() const { return cu_seqlens_padded[num_seqs]; }
  int64_t length(int b) const { return cu_seqlens[b + 1] - cu_seqlens[b]; }
  int64_t padded_start(int b) const { return cu_seqlens_padded[b]; }
  int64_t padded_length(int b) const { return cu_seqlens_padded[b + 1] - cu_seqlens_padded[b]; }
};

// An owned layout.
struct BatchLayout {
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;

  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  int64_t total_rows() const { return cu_seqlens_padded.back(); }
  int64_t valid_tokens() const { return cu_seqlens.back(); }
  LayoutView view() const { return LayoutView{cu_seqlens.data(), cu_seqlens_padded.data(), num_seqs()}; }
};

// Capacity a graph is captured for. Metadata arrays have max_seqs + 1 entries; at most
// max_seqs - 1 real sequences fit, because one placeholder is always reserved to absorb the
// rows past the last real sequence.
struct Capacity {
  int max_seqs = 0;
  int64_t max_tokens = 0;
};

// The layout of a batch in device memory, in its capacity form (section 1 of the design
// notes): `capacity.max_seqs + 1` int32 entries each, unused trailing entries repeating the
// last value, cu_seqlens_padded[max_seqs] == capacity.max_tokens. What every device-side call
// reads (table builds, reorders, RoPE, attention, AllGather CP), so that nothing needs the
// lengths on the host; the capacity says how many entries the arrays have and must be the
// one the call was planned for.
struct DeviceLayout {
  const int32_t* cu_seqlens = nullptr;
  const int32_t* cu_seqlens_padded = nullptr;
  Capacity capacity;
};

// The most rows a batch has: layouts' offsets are int32.
constexpr int64_t kMaxBatchRows = INT32_MAX;

// Smallest multiple of 2*cp that holds `length` tokens (0 stays 0).
int64_t cp_padded_length(int64_t length, int cp);

// Layout of documents packed back to back, each padded to a multiple of 2*cp
// (cp = 1 still pads to even lengths, so that the dual-chunk split of cp = 1 is defined).
BatchLayout make_layout(const std::vector<int64_t>& lengths, int cp);

// Layout of documents packed back to back with no padding, for the contiguous CP layout
// (contiguous.h): P_b = L_b but for the last document, padded so that the rows are a
// multiple of cp.
BatchLayout make_contiguous_layout(const std::vector<int64_t>& lengths, int cp);

// The same, padded out to a fixed capacity: trailing entries repeat the last offset
// (zero-length placeholders) and the last placeholder absorbs rows up to max_tokens.
// Throws when the documents do not fit, naming the limit that was exceeded.
BatchLayout make_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity);

// The contiguous layout in capacity form: documents back to back with no padding, then
// zero-length placeholders, the last of which absorbs the rows up to max_tokens (a multiple
// of cp). Throws when the documents do not fit, naming the limit that was exceeded.
BatchLayout make_contiguous_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity);

// Checks offsets against a tensor of `total_rows` rows:
//   both arrays start at 0 and never decrease, L_b <= P_b, the last padded offset equals
//   total_rows, everything fits int32, and with cp >= 1 every P_b is a multiple of 2*cp.
// cp = 0 skips the alignment rule (a single-device call). Throws thdcp::Error naming the
// index, the value and the rule broken.
void validate_layout(const LayoutView& layout, int64_t total_rows, int cp);

// The same for arrays of num_entries entries given as int64 (e.g. read from a file).
BatchLayout layout_from_int64(const std::vector<int64_t>& cu_seqlens,
                              const std::vector<int64_t>& cu_seqlens_padded);

}  // namespace thdcp
