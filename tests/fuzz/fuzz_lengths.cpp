// libFuzzer target: the planner's text inputs (thdcp/plan/planner.h, src/plan/lengths_file.cpp)
// and the planner on what they return.
//
// Each input is one file, read as a lengths file and as a batches file. What the readers
// return is packed and planned (count_packing, fit_long_documents, pack_documents,
// packed_batch, min_tokens_for, plan_capacity), bounded: an input whose packing makes more
// documents or batches than kMaxItems is not planned (the CLI checks such sizes against
// memory first, as planning_bytes estimates them).
//
// The planner's options come from an optional first line, a comment the readers skip:
//   #fuzz tokens=64 cp=1,2,4 long=split budget=0.05
// (defaults: tokens=64, cp=1,2, long=error, budget=0.01).
//
// A call may succeed or throw thdcp::Error; any other exception, a sanitizer report, or a
// result that breaks what planner.h promises (FUZZ_CHECK) is a finding.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"

namespace {

using thdcp::DocumentBatches;
using thdcp::DocumentLengths;
using thdcp::LongDocuments;

// The most documents or batches an input is planned with: planning is linear in them, and
// its pair balance is quadratic in the CP sizes (kMaxWork).
constexpr int64_t kMaxItems = 20000;
constexpr int64_t kMaxWork = 2000000;

struct Knobs {
  int64_t tokens = 64;
  std::vector<int> cp_sizes{1, 2};
  LongDocuments policy = LongDocuments::kError;
  double budget = 0.01;
};

int64_t to_int(const std::string& text, int64_t low, int64_t high) {
  const long long v = std::strtoll(text.c_str(), nullptr, 10);  // saturates; no UB
  return std::clamp<int64_t>(v, low, high);
}

// The "#fuzz ..." first line, if there is one.
Knobs knobs_of(const uint8_t* data, size_t size) {
  Knobs k;
  const std::string text(reinterpret_cast<const char*>(data), std::min<size_t>(size, 256));
  if (text.rfind("#fuzz", 0) != 0) return k;
  std::istringstream line(text.substr(0, text.find('\n')));
  std::string item;
  line >> item;  // "#fuzz"
  while (line >> item) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "tokens") {
      k.tokens = to_int(value, INT64_MIN, INT64_MAX);
    } else if (key == "cp") {
      k.cp_sizes.clear();
      std::istringstream list(value);
      std::string one;
      while (std::getline(list, one, ',') && k.cp_sizes.size() < 8) {
        k.cp_sizes.push_back(static_cast<int>(to_int(one, INT32_MIN, INT32_MAX)));
      }
    } else if (key == "long") {
      k.policy = value == "split" ? LongDocuments::kSplit
                 : value == "truncate" ? LongDocuments::kTruncate
                                       : LongDocuments::kError;
    } else if (key == "budget") {
      k.budget = std::strtod(value.c_str(), nullptr);
    }
  }
  return k;
}

// Runs `f`; thdcp::Error is an answer (nullopt), anything else escapes to libFuzzer.
template <typename F>
auto attempt(F&& f) -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const thdcp::Error& e) {
    thdcp::fuzz::trace(e.what());
    return std::nullopt;
  }
}

// The pair balance builds a table per batch, rank and CP size.
bool plannable(int64_t documents, int64_t batches, const std::vector<int>& cp_sizes) {
  int64_t work = 0;
  for (int cp : cp_sizes) work += static_cast<int64_t>(std::clamp(cp, 1, 4096)) * std::clamp(cp, 1, 4096);
  return documents <= kMaxItems && batches <= kMaxItems && work * (documents + batches) <= kMaxWork;
}

int64_t total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});  // each < 2^31, at most 2^31 of them
}

// What plan_capacity promises about its result.
void check_plan(const thdcp::CapacityPlan& plan, const DocumentBatches& batches, const thdcp::PlanOptions& options) {
  FUZZ_CHECK(plan.per_cp.size() == options.cp_sizes.size(), "one CpPlan per CP size");
  const thdcp::DocsPerBatch& d = plan.docs_per_batch;
  FUZZ_CHECK(d.batches == static_cast<int64_t>(batches.batches.size()), "docs_per_batch counts every batch");
  FUZZ_CHECK(d.p50 <= d.p90 && d.p90 <= d.p99 && d.p99 <= d.max, "percentiles in order");
  for (size_t i = 0; i < plan.per_cp.size(); ++i) {
    const thdcp::CpPlan& p = plan.per_cp[i];
    FUZZ_CHECK(p.cp == options.cp_sizes[i], "per_cp in the order of cp_sizes");
    FUZZ_CHECK(p.recommended >= 0 && p.recommended < static_cast<int>(p.candidates.size()), "recommended indexes");
    FUZZ_CHECK(p.padded_rows >= p.valid_tokens && p.valid_tokens >= 1, "padding adds rows");
    FUZZ_CHECK(static_cast<int>(p.balance.rank_pairs.size()) == p.cp, "one pair count per rank");
    for (const thdcp::CapacityCandidate& c : p.candidates) {
      FUZZ_CHECK(c.max_seqs >= 1 && c.fallback_fraction >= 0 && c.fallback_fraction <= 1, "candidate in range");
    }
  }
}

// Packing and planning of the documents of a lengths file.
void plan_lengths(const DocumentLengths& documents, const Knobs& k) {
  const auto alignment = attempt([&] { return thdcp::packing_alignment(k.cp_sizes); });
  if (!alignment) return;
  const auto size = attempt([&] { return thdcp::count_packing(documents, k.tokens, *alignment, k.policy); });
  if (!size) return;
  FUZZ_CHECK(size->documents >= static_cast<int64_t>(documents.lengths.size()), "a policy never drops documents");
  (void)thdcp::planning_bytes(*size, thdcp::document_bytes(documents));
  if (!plannable(size->documents, size->batches, k.cp_sizes)) return;

  int64_t touched = -1;
  const auto fitted =
      attempt([&] { return thdcp::fit_long_documents(documents, k.tokens, *alignment, k.policy, &touched); });
  FUZZ_CHECK(fitted.has_value(), "fit_long_documents refused what count_packing counted");
  FUZZ_CHECK(static_cast<int64_t>(fitted->lengths.size()) == size->documents, "count_packing counts the documents");
  FUZZ_CHECK(touched == size->touched, "count_packing counts the documents split or cut");
  FUZZ_CHECK(total(fitted->lengths) <= total(documents.lengths), "fitting never adds tokens");

  const auto packed = attempt([&] { return thdcp::pack_documents(*fitted, k.tokens, *alignment); });
  if (!packed) {
    FUZZ_CHECK(k.policy == LongDocuments::kError, "pack_documents refused documents fitted to a batch");
    return;
  }
  FUZZ_CHECK(static_cast<int64_t>(packed->batches.size()) == size->batches, "count_packing counts the batches");
  std::vector<int64_t> flat;
  for (const auto& batch : packed->batches) {
    FUZZ_CHECK(!batch.empty(), "no empty batch");
    int64_t rows = 0;
    for (int64_t length : batch) rows += (length + *alignment - 1) / *alignment * *alignment;
    FUZZ_CHECK(rows <= k.tokens, "a packed batch holds at most tokens rows");
    flat.insert(flat.end(), batch.begin(), batch.end());
  }
  FUZZ_CHECK(flat == fitted->lengths, "packing keeps the documents in order");
  // packed_batch builds one batch alone: the first, the last and one past them.
  for (const int64_t index : {int64_t{0}, size->batches - 1, size->batches}) {
    int64_t count = -1;
    const std::vector<int64_t> one = thdcp::packed_batch(*fitted, k.tokens, *alignment, index, &count);
    FUZZ_CHECK(count == size->batches, "packed_batch counts the batches");
    FUZZ_CHECK(index < count ? one == packed->batches[static_cast<size_t>(index)] : one.empty(),
               "packed_batch is that batch of pack_documents");
  }

  thdcp::PlanOptions options;
  options.tokens = k.tokens;
  options.cp_sizes = k.cp_sizes;
  options.fallback_budget = k.budget;
  if (const auto plan = attempt([&] { return thdcp::plan_capacity(*packed, options); })) {
    check_plan(*plan, *packed, options);
    thdcp::fuzz::trace("planned " + std::to_string(packed->batches.size()) + " packed batches");
  }
}

// Whether the planner's pair counts summed over the batches could pass int64: a bound on them,
// every batch's rows (each document padded for the largest CP size) squared, summed.
bool pairs_may_overflow(const DocumentBatches& batches, const std::vector<int>& cp_sizes) {
  int64_t cp = 1;
  for (int c : cp_sizes) cp = std::max<int64_t>(cp, c);
  long double bound = 0;
  for (const auto& batch : batches.batches) {
    long double rows = 0;
    for (int64_t length : batch) rows += static_cast<long double>(length) + 2.0L * static_cast<long double>(cp);
    bound += rows * rows;
  }
  return bound > static_cast<long double>(INT64_MAX);
}

// Planning the batches of a batches file: at the smallest tokens that hold them, and at the
// knob's.
void plan_batches(const DocumentBatches& batches, const Knobs& k) {
  int64_t documents = 0;
  for (const auto& batch : batches.batches) documents += static_cast<int64_t>(batch.size());
  if (!plannable(documents, static_cast<int64_t>(batches.batches.size()), k.cp_sizes)) return;
  const auto tokens = attempt([&] { return thdcp::min_tokens_for(batches, k.cp_sizes); });
  thdcp::PlanOptions options;
  options.cp_sizes = k.cp_sizes;
  options.fallback_budget = k.budget;
  for (const int64_t t : {tokens.value_or(-1), k.tokens}) {
    options.tokens = t;
    const auto plan = attempt([&] { return thdcp::plan_capacity(batches, options); });
    if (plan) {
      check_plan(*plan, batches, options);
      thdcp::fuzz::trace("planned " + std::to_string(batches.batches.size()) + " batches at tokens=" + std::to_string(t));
    }
    if (t == tokens.value_or(-1) && t > 0) {
      // min_tokens_for: every batch fits it, so only the options can be refused, or pair
      // counts summed over batches past int64 (each batch's fit: at most its rows squared;
      // documents near 2^31 tokens in several batches pass 2^63 together).
      FUZZ_CHECK(plan.has_value() || !(k.budget >= 0 && k.budget <= 1) || pairs_may_overflow(batches, k.cp_sizes),
                 "plan_capacity refused min_tokens_for");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = thdcp::fuzz::ScratchFiles::get().write("input.txt", data, size);
  const Knobs knobs = knobs_of(data, size);

  if (const auto lengths = attempt([&] { return thdcp::read_lengths_file(path); })) {
    FUZZ_CHECK(!lengths->lengths.empty() && lengths->lengths.size() == lengths->lines.size(), "a line per length");
    for (int64_t length : lengths->lengths) FUZZ_CHECK(length >= 1 && length <= INT32_MAX, "lengths in [1, 2^31)");
    plan_lengths(*lengths, knobs);
  }

  const auto batches = attempt([&] { return thdcp::read_batches_file(path); });
  const auto counted = attempt([&] { return thdcp::count_batches_file(path); });
  // count_batches_file checks every value as read_batches_file does; only an empty file (no
  // batches) is a count of 0 there and an error here.
  FUZZ_CHECK(counted.has_value() == (batches.has_value() || (counted && counted->batches == 0)),
             "count_batches_file and read_batches_file accept the same files");
  if (batches) {
    int64_t documents = 0;
    for (const auto& batch : batches->batches) {
      FUZZ_CHECK(!batch.empty(), "a batches file has no empty batch");
      for (int64_t length : batch) FUZZ_CHECK(length >= 1 && length <= INT32_MAX, "lengths in [1, 2^31)");
      documents += static_cast<int64_t>(batch.size());
    }
    FUZZ_CHECK(counted->batches == static_cast<int64_t>(batches->batches.size()) && counted->documents == documents,
               "count_batches_file counts what read_batches_file reads");
    plan_batches(*batches, knobs);
  }
  return 0;
}
