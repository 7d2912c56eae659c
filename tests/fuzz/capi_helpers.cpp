#include "capi_helpers.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "capi_checks.h"
#include "thdcp/thdcp.h"

namespace thdcp::fuzz {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// The dual-chunk split's buffers: layouts of at most this many rows, at most kMaxSplitBytes.
constexpr int64_t kMaxSplitRows = int64_t{1} << 16;
constexpr int64_t kMaxSplitBytes = int64_t{1} << 22;
// Planning splits long documents into pieces: at most this many are planned.
constexpr int64_t kMaxPlanPieces = 20000;

int decode_cp(Program& p) {
  const uint8_t b = p.u8();
  return b < 240 ? 1 + b % 8 : p.value_i32();
}

__int128 round_up(__int128 length, __int128 align) { return (length + align - 1) / align * align; }

// Lengths the helpers accept: a count in [0, 2^31), an array (or none for 0), each >= 0.
bool valid_lengths(const Lengths& l) {
  if (l.count < 0 || l.count > kInt32Max || (l.null && l.count > 0)) return false;
  for (int64_t i = 0; i < l.count; ++i) {
    if (l.values[static_cast<size_t>(i)] < 0) return false;
  }
  return true;
}

// The documents' rows, each padded to a multiple of 2*cp, as thdcp_padded_rows defines them;
// -1 where it must refuse (a length within 2*cp of 2^63, a sum past 2^63-1).
__int128 padded_sum(const Lengths& l, int cp) {
  const __int128 align = 2 * static_cast<__int128>(cp);
  __int128 rows = 0;
  for (int64_t i = 0; i < l.count; ++i) {
    const int64_t length = l.values[static_cast<size_t>(i)];
    if (length + align > kInt64Max) return -1;
    rows += round_up(length, align);
    if (rows > kInt64Max) return -1;
  }
  return rows;
}

// A capacity: mostly small, valid ones.
thdcp_capacity_t decode_capacity(Program& p) {
  thdcp_capacity_t c{};
  const uint8_t b = p.u8();
  c.max_tokens = b < 240 ? 16 * (b % 16) : p.value_i64();
  const uint8_t s = p.u8();
  c.max_seqs = s < 240 ? 1 + s % 8 : p.value_i32();
  return c;
}

void padded_rows(Program& p, const Lengths& l, int cp) {
  const bool null_out = p.u8() == 255;
  int64_t rows = -7;
  const thdcp_status_t status = CALL(thdcp_padded_rows, l.data(), l.count, cp, null_out ? nullptr : &rows);
  const __int128 expected = valid_lengths(l) && cp >= 1 ? padded_sum(l, cp) : -1;
  if (expected >= 0 && !null_out) {
    expect(status, THDCP_SUCCESS, "thdcp_padded_rows of valid lengths");
    FUZZ_CHECK(rows == static_cast<int64_t>(expected), "thdcp_padded_rows is the sum of the padded lengths");
  } else {
    FUZZ_CHECK(status != THDCP_SUCCESS && rows == -7, "thdcp_padded_rows refuses (and writes nothing) when it must");
  }
}

// Layout arrays of `sequences` + 1 int32 each, as the call's output (or NULL when they cannot
// be: a count the call must refuse, or one memory cannot back).
struct LayoutOut {
  std::vector<int32_t> cu, padded;
  bool null = false;
  LayoutOut(Program& p, int64_t sequences) {
    null = sequences < 0 || sequences > kMaxDocuments || p.u8() == 255;
    cu.assign(null ? 1 : static_cast<size_t>(sequences) + 1, -7);
    padded.assign(cu.size(), -7);
  }
  int32_t* cu_arg() { return null ? nullptr : cu.data(); }
  int32_t* padded_arg() { return null ? nullptr : padded.data(); }
  bool untouched() const {
    return std::all_of(cu.begin(), cu.end(), [](int32_t x) { return x == -7; }) &&
           std::all_of(padded.begin(), padded.end(), [](int32_t x) { return x == -7; });
  }
};

// The nonzero lengths, in order (the capacity helpers drop zero-length documents).
std::vector<int64_t> nonzero(const Lengths& l) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < l.count; ++i) {
    if (l.values[static_cast<size_t>(i)] > 0) out.push_back(l.values[static_cast<size_t>(i)]);
  }
  return out;
}

void make_layout(Program& p, const Lengths& l, int cp) {
  LayoutOut out(p, l.count);
  const thdcp_status_t status = CALL(thdcp_make_layout, l.data(), l.count, cp, out.cu_arg(), out.padded_arg());
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(out.untouched(), "a refused thdcp_make_layout wrote its arrays");
    return;
  }
  // Back to back, every document (zero-length ones too) padded to a multiple of 2*cp.
  FUZZ_CHECK(out.cu[0] == 0 && out.padded[0] == 0, "layouts start at 0");
  for (int64_t i = 0; i < l.count; ++i) {
    const size_t b = static_cast<size_t>(i);
    FUZZ_CHECK(int64_t{out.cu[b + 1]} - out.cu[b] == l.values[b], "cu_seqlens are the lengths' prefix sums");
    FUZZ_CHECK(int64_t{out.padded[b + 1]} - out.padded[b] == round_up(l.values[b], 2 * static_cast<__int128>(cp)),
               "cu_seqlens_padded are the padded lengths' prefix sums");
  }
}

// The contiguous twin: documents back to back with no padding of their own, the last one
// padded so that the rows are a multiple of cp.
void make_contiguous_layout(Program& p, const Lengths& l, int cp) {
  LayoutOut out(p, l.count);
  const thdcp_status_t status =
      CALL(thdcp_make_contiguous_layout, l.data(), l.count, cp, out.cu_arg(), out.padded_arg());
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(out.untouched(), "a refused thdcp_make_contiguous_layout wrote its arrays");
    return;
  }
  FUZZ_CHECK(l.count >= 1 && out.cu[0] == 0 && out.padded[0] == 0, "layouts start at 0");
  for (int64_t i = 0; i < l.count; ++i) {
    const size_t b = static_cast<size_t>(i);
    FUZZ_CHECK(int64_t{out.cu[b + 1]} - out.cu[b] == l.values[b], "cu_seqlens are the lengths' prefix sums");
    if (i + 1 < l.count) FUZZ_CHECK(out.padded[b + 1] == out.cu[b + 1], "no document but the last is padded");
  }
  const size_t last = static_cast<size_t>(l.count);
  FUZZ_CHECK(out.padded[last] == round_up(out.cu[last], static_cast<__int128>(cp)),
             "the rows are the tokens rounded up to a multiple of cp");
}

void capacity_default(Program& p) {
  const int64_t max_tokens = p.u8() < 240 ? 16 * p.u8() : p.value_i64();
  const int cp = decode_cp(p);
  thdcp_capacity_t c{-7, -7};
  const thdcp_status_t status = CALL(thdcp_capacity_default, max_tokens, cp, p.u8() == 255 ? nullptr : &c);
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(c.max_tokens == -7 && c.max_seqs == -7, "a refused thdcp_capacity_default wrote its output");
    return;
  }
  FUZZ_CHECK(cp >= 1 && max_tokens > 0 && max_tokens % (2 * int64_t{cp}) == 0, "capacity_default's preconditions");
  FUZZ_CHECK(c.max_tokens == max_tokens && int64_t{c.max_seqs} == max_tokens / (2 * int64_t{cp}) + 1,
             "capacity_default is (max_tokens / (2 cp) + 1, max_tokens)");
}

// Not an answer of the enum, yet a value of its range (C++ forbids loading others).
constexpr thdcp_fit_t kNoFit = static_cast<thdcp_fit_t>(3);

void check_fit(Program& p, const Lengths& l, int cp) {
  const thdcp_capacity_t c = decode_capacity(p);
  const bool null_capacity = p.u8() == 255;
  thdcp_fit_t fit = kNoFit;
  const thdcp_status_t status =
      CALL(thdcp_capacity_check_fit, l.data(), l.count, cp, null_capacity ? nullptr : &c, &fit);
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(fit == kNoFit, "a refused thdcp_capacity_check_fit wrote its answer");
    return;
  }
  FUZZ_CHECK(valid_lengths(l) && cp >= 1 && !null_capacity, "check_fit's preconditions");
  if (c.max_seqs < 1 || c.max_tokens < 0) return;  // no capacity: the answer is not defined
  const int64_t documents = static_cast<int64_t>(nonzero(l).size());
  const thdcp_fit_t expected = padded_sum(l, cp) > c.max_tokens ? THDCP_FIT_TOO_MANY_TOKENS
                               : documents > int64_t{c.max_seqs} - 1 ? THDCP_FIT_TOO_MANY_SEQUENCES
                                                                     : THDCP_FIT_FITS;
  FUZZ_CHECK(fit == expected, "thdcp_capacity_check_fit's answer: " + std::to_string(fit) + " expected " +
                                  std::to_string(expected));
}

void capacity_layout(Program& p, const Lengths& l, int cp) {
  const thdcp_capacity_t c = decode_capacity(p);
  LayoutOut out(p, c.max_seqs);
  const thdcp_status_t status =
      CALL(thdcp_capacity_layout, l.data(), l.count, cp, &c, out.cu_arg(), out.padded_arg());
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(out.untouched(), "a refused thdcp_capacity_layout wrote its arrays");
    return;
  }
  // The documents that fit, zero-length ones dropped; then placeholders repeating the last
  // offset, the last padded entry max_tokens.
  const std::vector<int64_t> docs = nonzero(l);
  FUZZ_CHECK(c.max_seqs >= 1 && static_cast<int64_t>(docs.size()) <= int64_t{c.max_seqs} - 1 &&
                 padded_sum(l, cp) <= c.max_tokens,
             "capacity_layout accepted a batch that does not fit");
  const size_t seqs = static_cast<size_t>(c.max_seqs);
  FUZZ_CHECK(out.cu[0] == 0 && out.padded[0] == 0 && out.padded[seqs] == c.max_tokens, "capacity form's ends");
  for (size_t b = 0; b < seqs; ++b) {
    const int64_t length = b < docs.size() ? docs[b] : 0;
    const int64_t padded = b < docs.size() ? static_cast<int64_t>(round_up(length, 2 * static_cast<__int128>(cp)))
                                           : (b + 1 == seqs ? int64_t{out.padded[seqs]} - out.padded[b] : 0);
    FUZZ_CHECK(int64_t{out.cu[b + 1]} - out.cu[b] == length, "capacity form's cu_seqlens");
    FUZZ_CHECK(int64_t{out.padded[b + 1]} - out.padded[b] == padded, "capacity form's cu_seqlens_padded");
  }
}

void choose_cp_size(Program& p, const Lengths& l) {
  const uint8_t b = p.u8();
  int num_sizes = b < 240 ? b % 5 : p.value_i32();
  if (num_sizes > 64) num_sizes %= 65;  // a count memory cannot back: not a program
  std::vector<int32_t> sizes(static_cast<size_t>(std::max(num_sizes, 1)));
  for (int32_t& s : sizes) s = decode_cp(p);
  const int64_t rows_per_rank = p.u8() < 240 ? p.u8() : p.value_i64();
  int32_t chosen = -7;
  const thdcp_status_t status =
      CALL(thdcp_choose_cp_size, l.data(), l.count, sizes.data(), num_sizes, rows_per_rank, &chosen);
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(chosen == -7, "a refused thdcp_choose_cp_size wrote its answer");
    return;
  }
  // The smallest size whose rows per rank fit.
  const auto fits = [&](int32_t s) { return s >= 1 && padded_sum(l, s) >= 0 && padded_sum(l, s) / s <= rows_per_rank; };
  FUZZ_CHECK(std::find(sizes.begin(), sizes.begin() + num_sizes, chosen) != sizes.begin() + num_sizes && fits(chosen),
             "choose_cp_size picks a listed size that fits");
  for (int i = 0; i < num_sizes; ++i) {
    FUZZ_CHECK(!(sizes[static_cast<size_t>(i)] < chosen && fits(sizes[static_cast<size_t>(i)])),
               "choose_cp_size picks the smallest size that fits");
  }
}

void plan_capacity(Program& p, const Lengths& l) {
  thdcp_capacity_plan_params v = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  v.tokens = p.u8() < 240 ? 16 * (1 + p.u8() % 64) : p.value_i64();
  const double budgets[] = {0.01, 0.0, 1.0, 0.5, -0.1, std::numeric_limits<double>::quiet_NaN(), 1.5, 0.01};
  v.fallback_budget = budgets[p.u8() % 8];
  v.cp_size = decode_cp(p);
  const uint8_t long_docs = p.u8();
  v.long_documents = long_docs < 240 ? long_docs % 3 : p.value_i32();
  const ParamsBuffer<thdcp_capacity_plan_params> params(p, v, THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE);
  const thdcp_capacity_plan_params read =
      as_read(v, params.get()->struct_size, thdcp_capacity_plan_params(THDCP_CAPACITY_PLAN_PARAMS_INIT));
  // Splitting makes a document per piece: plans of more pieces than kMaxPlanPieces are not made.
  if (read.long_documents == 1 && read.cp_size >= 1 && read.tokens >= 2 * int64_t{read.cp_size} && valid_lengths(l)) {
    const int64_t longest = read.tokens / (2 * int64_t{read.cp_size}) * (2 * int64_t{read.cp_size});
    __int128 pieces = 0;
    for (int64_t i = 0; i < l.count; ++i) pieces += (static_cast<__int128>(l.values[static_cast<size_t>(i)]) + longest - 1) / longest;
    if (pieces > kMaxPlanPieces) return;
  }

  // The caller's result struct: struct_size bytes, filled with a pattern the call must keep
  // where it does not write (struct_size itself, and bytes past the fields it knows).
  const uint8_t form = p.u8();
  size_t size = sizeof(thdcp_capacity_plan_result);
  if (form >= 224) {
    const size_t sizes[] = {THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE, 8, sizeof(thdcp_capacity_plan_result) + 16, 4104,
                            sizeof(thdcp_capacity_plan_result) - 4, 0};
    size = sizes[form % 6];
  }
  std::vector<unsigned char> result(std::max(size, sizeof(size_t)), 0xa5);
  std::memcpy(result.data(), &size, sizeof(size));
  const std::vector<unsigned char> before = result;
  thdcp_capacity_plan_result* out = reinterpret_cast<thdcp_capacity_plan_result*>(result.data());
  const thdcp_status_t status = CALL(thdcp_plan_capacity, l.data(), l.count, params.get(), out);
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(result == before, "a refused thdcp_plan_capacity wrote its result");
    return;
  }
  const size_t written = std::min(size, sizeof(thdcp_capacity_plan_result));
  FUZZ_CHECK(std::memcmp(result.data(), before.data(), sizeof(size_t)) == 0 &&
                 std::equal(result.begin() + static_cast<std::ptrdiff_t>(written), result.end(),
                            before.begin() + static_cast<std::ptrdiff_t>(written)),
             "thdcp_plan_capacity wrote past the fields that fit the caller's struct_size");
  FUZZ_CHECK(out->capacity.max_tokens == read.tokens && out->capacity.max_seqs >= 1 && out->batches >= 1 &&
                 out->fallback_fraction >= 0 && out->fallback_fraction <= 1 && out->padding_fraction >= 0 &&
                 out->padding_fraction < 1,
             "thdcp_plan_capacity's result");
}

}  // namespace

void capacity_helpers(Program& p) {
  const uint8_t which = p.u8();
  const Lengths lengths = decode_lengths(p);
  const int cp = decode_cp(p);
  switch (which % 8) {
    case 0: padded_rows(p, lengths, cp); break;
    case 1: make_layout(p, lengths, cp); break;
    case 7: make_contiguous_layout(p, lengths, cp); break;
    case 2: capacity_default(p); break;
    case 3: check_fit(p, lengths, cp); break;
    case 4: capacity_layout(p, lengths, cp); break;
    case 5: choose_cp_size(p, lengths); break;
    default: plan_capacity(p, lengths); break;
  }
}

namespace {

// Bytes 0, 1, 2, ... of a pattern (`seed` tells buffers apart).
void fill_pattern(unsigned char* bytes, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i * 131 + seed);
}

}  // namespace

// thdcp_cp_local_rows_ex, thdcp_cp_split_ex and thdcp_cp_merge_ex (the plain ones are
// these with the dual-chunk layout) on a layout with buffers of its rows (T * row_bytes
// global, T / cp * row_bytes local), apart, overlapping or adjacent, for either CP layout or
// a value that is none. A split or merge that succeeds moved exactly the rows
// thdcp_cp_local_rows_ex names.
void split_merge(Program& p) {
  const int cp = decode_cp(p);
  const uint8_t r = p.u8();
  const int rank = r < 240 ? r % std::max(cp, 1) : p.value_i32();
  const uint8_t choice = p.u8();
  const int32_t raw_layout = choice < 112 ? THDCP_CP_LAYOUT_DUAL_CHUNK
                             : choice < 240 ? THDCP_CP_LAYOUT_CONTIGUOUS
                                            : p.value_i32();
  // Kept as an int and passed as a prvalue: a variable of the enum type holding a value
  // outside it would be undefined behaviour in this C++ harness (the library reads the
  // argument's bytes, as C callers may pass any int).
  const auto cp_layout = [raw_layout] { return static_cast<thdcp_cp_layout_t>(raw_layout); };
  const bool contiguous = raw_layout == THDCP_CP_LAYOUT_CONTIGUOUS;
  Layout layout;
  decode_layout(p, (contiguous ? 1 : 2) * std::clamp(cp, 1, 1 << 20), 0, layout);
  const uint8_t which = p.u8() % 3, row = p.u8();
  size_t row_bytes = 1 + row % 16;
  if (row >= 240) {
    const size_t special[] = {0, std::numeric_limits<size_t>::max(), size_t{1} << 62, size_t{1} << 33,
                              static_cast<size_t>(p.u64())};
    row_bytes = special[row % 5];
  }
  const int64_t rows = layout.total_rows();
  if (rows > kMaxSplitRows) return;  // a layout this long may be valid: no memory for it
  const int64_t local_rows = rows >= 0 && cp >= 1 ? rows / cp : 0;
  const __int128 global_bytes = static_cast<__int128>(std::max<int64_t>(rows, 0)) * row_bytes;
  if (global_bytes > kMaxSplitBytes && global_bytes <= kInt64Max) return;
  // A byte count past 2^63-1 must be refused before anything is read: a few bytes stand in.
  const bool backed = global_bytes <= kMaxSplitBytes;
  const size_t global_size = backed ? static_cast<size_t>(global_bytes) : 16;
  const size_t local_size = backed ? static_cast<size_t>(local_rows) * row_bytes : 16;

  if (which == 0) {
    const uint8_t n = p.u8();
    int64_t num_rows = n % 8 < 5 ? local_rows : n % 8 == 5 ? local_rows + 1 : n % 8 == 6 ? local_rows - 1 : p.value_i64();
    const size_t entries = num_rows >= 0 && num_rows <= local_rows + 1 ? static_cast<size_t>(num_rows)
                                                                         : static_cast<size_t>(local_rows);
    std::vector<int32_t> map(std::max<size_t>(entries, 1), -7);
    const thdcp_status_t status =
        CALL(thdcp_cp_local_rows_ex, &layout.c, cp, rank, p.u8() == 255 ? nullptr : map.data(), num_rows, cp_layout());
    if (status != THDCP_SUCCESS) {
      FUZZ_CHECK(std::all_of(map.begin(), map.end(), [](int32_t x) { return x == -7; }),
                 "a refused thdcp_cp_local_rows wrote its array");
      return;
    }
    FUZZ_CHECK(num_rows == local_rows, "local_rows took a num_rows other than T / cp");
    std::set<int32_t> seen;
    for (int64_t i = 0; i < num_rows; ++i) {
      const int32_t g = map[static_cast<size_t>(i)];
      FUZZ_CHECK(g >= 0 && g < rows && seen.insert(g).second, "local rows are distinct rows of the layout");
    }
    return;
  }

  // One allocation holds both buffers: apart, local inside global, or right after it.
  const uint8_t place = p.u8() % 4, offset = p.u8();
  std::vector<unsigned char> memory;
  unsigned char *global = nullptr, *local = nullptr;
  if (place == 2 && global_size > 0) {
    const size_t at = offset % global_size;
    memory.assign(std::max(global_size, at + local_size) + 1, 0);
    global = memory.data();
    local = memory.data() + at;
  } else {
    memory.assign(global_size + local_size + 1, 0);
    global = memory.data();
    local = memory.data() + global_size + (place == 3 ? 0 : 1);  // apart: a byte between them
  }
  fill_pattern(memory.data(), memory.size(), 7);
  const bool overlap = local < global + global_size && global < local + local_size && global_size > 0 && local_size > 0;
  const std::vector<unsigned char> before = memory;
  const thdcp_status_t status =
      which == 1 ? CALL(thdcp_cp_split_ex, global, local, row_bytes, &layout.c, cp, rank, cp_layout())
                 : CALL(thdcp_cp_merge_ex, local, global, row_bytes, &layout.c, cp, rank, cp_layout());
  if (status != THDCP_SUCCESS) {
    FUZZ_CHECK(memory == before, "a refused split or merge wrote its output");
    return;
  }
  FUZZ_CHECK(backed && !overlap, "a split or merge of overlapping buffers or a byte count past 2^63-1 succeeded");
  std::vector<int32_t> map(static_cast<size_t>(std::max<int64_t>(local_rows, 1)));
  expect(CALL(thdcp_cp_local_rows_ex, &layout.c, cp, rank, map.data(), local_rows, cp_layout()), THDCP_SUCCESS,
         "local_rows of a layout that split or merge accepted");
  std::vector<unsigned char> expected = before;
  for (int64_t i = 0; i < local_rows; ++i) {
    const size_t g = static_cast<size_t>(map[static_cast<size_t>(i)]) * row_bytes;
    const size_t l = static_cast<size_t>(i) * row_bytes;
    const size_t global_at = static_cast<size_t>(global - memory.data()) + g;
    const size_t local_at = static_cast<size_t>(local - memory.data()) + l;
    if (which == 1) {
      std::memcpy(expected.data() + local_at, before.data() + global_at, row_bytes);
    } else {
      std::memcpy(expected.data() + global_at, before.data() + local_at, row_bytes);
    }
  }
  FUZZ_CHECK(memory == expected, "split / merge moved exactly the rows thdcp_cp_local_rows names");
}

void library_calls(Program& p) {
  const int32_t raw = p.u8() < 240 ? p.u8() % 10 : p.value_i32();
  const char* name = thdcp_status_name(static_cast<thdcp_status_t>(raw));
  FUZZ_CHECK(name != nullptr && (std::strcmp(name, "THDCP_STATUS_UNKNOWN") == 0) == (raw < 0 || raw > 7),
             "thdcp_status_name");
  FUZZ_CHECK(thdcp_last_error() != nullptr, "thdcp_last_error is never NULL");
  FUZZ_CHECK(thdcp_version_string() != nullptr && thdcp_version_string()[0] != '\0', "a version string");
  FUZZ_CHECK(thdcp_abi_version() == THDCP_ABI_VERSION, "ABI version");
  const int32_t feature = p.u8() < 240 ? p.u8() % 4 : p.value_i32();
  const bool null_out = p.u8() == 255;
  int built = -7;
  const thdcp_status_t status =
      CALL(thdcp_built_with, static_cast<thdcp_feature_t>(feature), null_out ? nullptr : &built);
  if (feature >= 0 && feature <= 2 && !null_out) {
    expect(status, THDCP_SUCCESS, "thdcp_built_with a feature");
    FUZZ_CHECK(feature == THDCP_FEATURE_CUDA ? built == 0 : built == 0 || built == 1, "built_with answers 0 or 1");
  } else {
    FUZZ_CHECK(status == THDCP_ERROR_INVALID_ARGUMENT && built == -7, "built_with refuses what is not a feature");
  }
}

}  // namespace thdcp::fuzz
