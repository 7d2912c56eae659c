#include "thdcp/plan/planner.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>

#include "thdcp/core/error.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {

namespace {

// The source as messages name it: a file's path (lines known) as a quoted excerpt, never raw;
// a caller's own description ("lengths") as it is.
std::string source_name(const std::string& source, const std::vector<int64_t>& lines) {
  return lines.empty() ? source : quote_excerpt(source, kPathExcerptChars);
}

// "'FILE':LINE: " when the origin is known, "SOURCE: " or "" otherwise.
std::string where(const std::string& source, const std::vector<int64_t>& lines, size_t index) {
  if (source.empty()) return "";
  if (index < lines.size()) return source_name(source, lines) + ":" + std::to_string(lines[index]) + ": ";
  return source_name(source, lines) + ": ";
}

int64_t padded_to(int64_t length, int64_t alignment) {
  THDCP_CHECK(length <= std::numeric_limits<int64_t>::max() - (alignment - 1),
              "a length of " << length << " cannot be padded to a multiple of " << alignment
                             << " in int64: no batch holds it (offsets are int32)");
  return (length + (alignment - 1)) / alignment * alignment;
}

// The rows of a batch with its documents padded to multiples of `alignment`, or
// kMaxBatchRows + 1 when they are more than any batch holds: a sum that cannot overflow,
// whatever the lengths of a C++ caller's batches.
int64_t batch_rows(const std::vector<int64_t>& batch, int64_t alignment) {
  int64_t rows = 0;
  for (int64_t length : batch) {
    rows += padded_to(std::min(length, kMaxBatchRows + 1), alignment);
    rows = std::min(rows, kMaxBatchRows + 1);
  }
  return rows;
}

std::string format_bytes(int64_t bytes) {
  char text[32];
  if (bytes < 1024) {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  } else if (bytes < 1024 * 1024) {
    std::snprintf(text, sizeof(text), "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return text;
}

std::string format_percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f%%", 100.0 * fraction);
  return text;
}

void check_cp_sizes(const std::vector<int>& cp_sizes) {
  THDCP_CHECK(!cp_sizes.empty(), "the list of CP sizes is empty: give at least one (e.g. 1,2,4,8)");
  std::set<int> seen;
  for (int cp : cp_sizes) {
    THDCP_CHECK(cp >= 1, "CP size " << cp << " must be >= 1 (1 means no context parallelism)");
    THDCP_CHECK(seen.insert(cp).second, "CP size " << cp << " is listed twice: give each CP size once");
  }
}

DocsPerBatch docs_per_batch(const DocumentBatches& input) {
  DocsPerBatch d;
  d.batches = static_cast<int64_t>(input.batches.size());
  for (const auto& batch : input.batches) d.counts.push_back(static_cast<int64_t>(batch.size()));
  d.mean = static_cast<double>(std::accumulate(d.counts.begin(), d.counts.end(), int64_t{0})) / d.batches;
  d.p50 = percentile_nearest_rank(d.counts, 50);
  d.p90 = percentile_nearest_rank(d.counts, 90);
  d.p99 = percentile_nearest_rank(d.counts, 99);
  d.max = percentile_nearest_rank(d.counts, 100);
  return d;
}

CapacityCandidate candidate(const std::string& label, int64_t real_sequences, const std::vector<int64_t>& counts) {
  CapacityCandidate c;
  c.label = label;
  c.max_seqs = real_sequences + 1;  // one placeholder is always reserved
  for (int64_t n : counts) c.fallback_batches += n > c.max_seqs - 1 ? 1 : 0;
  c.fallback_fraction = static_cast<double>(c.fallback_batches) / static_cast<double>(counts.size());
  c.metadata_bytes = capacity_metadata_bytes(c.max_seqs);
  return c;
}

void recommend(CpPlan& plan, double fallback_budget) {
  const std::vector<CapacityCandidate>& c = plan.candidates;
  const int never = static_cast<int>(c.size()) - 1;  // T/(2cp): never falls back
  int pick = never;
  for (int i = 0; i < never; ++i) {
    if (c[i].fallback_fraction <= fallback_budget) {
      pick = i;
      break;
    }
  }
  if (pick != never && c[never].max_seqs <= 2 * c[pick].max_seqs) {
    plan.recommended = never;
    plan.reason = "max_seqs=" + std::to_string(c[never].max_seqs) + " (T/(2cp)+1) never falls back, whatever the "
                  "data, and is at most twice " + c[pick].label + "+1=" + std::to_string(c[pick].max_seqs) +
                  "; metadata " + format_bytes(c[never].metadata_bytes) + " per rank";
    return;
  }
  plan.recommended = pick;
  const CapacityCandidate& r = c[pick];
  if (pick == never) {
    plan.reason = "max_seqs=" + std::to_string(r.max_seqs) + " (T/(2cp)+1): every smaller candidate falls back "
                  "in more than " + format_percent(fallback_budget) + " of batches; metadata " +
                  format_bytes(r.metadata_bytes) + " per rank";
    return;
  }
  plan.reason = "max_seqs=" + std::to_string(r.max_seqs) + " (" + r.label + "+1): " +
                format_percent(r.fallback_fraction) + " of batches fall back to eager (budget " +
                format_percent(fallback_budget) + "), metadata " + format_bytes(r.metadata_bytes) +
                " per rank; T/(2cp)+1=" + std::to_string(c[never].max_seqs) +
                " would never fall back but sizes every graph's grids for that many sequences";
}

}  // namespace

int64_t packing_alignment(const std::vector<int>& cp_sizes) {
  check_cp_sizes(cp_sizes);
  int64_t alignment = 1;
  for (int cp : cp_sizes) {
    const int64_t two_cp = 2 * static_cast<int64_t>(cp);
    const int64_t g = std::gcd(alignment, two_cp);
    THDCP_CHECK(alignment / g <= std::numeric_limits<int32_t>::max() / two_cp,
                "the CP sizes have no common alignment below 2^31 rows (lcm of 2*cp): use fewer or "
                "power-of-two CP sizes");
    alignment = alignment / g * two_cp;
  }
  return alignment;
}

namespace {

// Packs documents in order (the definition in planner.h): calls place(batch, i) for every
// document i, batch counting from 0. Throws naming a document that does not fit a batch.
template <typename Place>
void walk_packing(const DocumentLengths& documents, int64_t tokens, int64_t alignment, Place place) {
  THDCP_CHECK(alignment >= 1, "packing alignment " << alignment << " must be >= 1");
  THDCP_CHECK(tokens >= alignment, "tokens=" << tokens << " is smaller than the packing alignment "
                                             << alignment << " (lcm of 2*cp): raise tokens");
  int64_t batch = -1;
  int64_t used = 0;
  for (size_t i = 0; i < documents.lengths.size(); ++i) {
    const int64_t length = documents.lengths[i];
    THDCP_CHECK(length >= 1, where(documents.source, documents.lines, i)
                                 << "document " << i << " has length " << length << ": lengths must be >= 1");
    const int64_t rows = padded_to(length, alignment);
    THDCP_CHECK(rows <= tokens, where(documents.source, documents.lines, i)
                                    << "document " << i << " has " << length << " tokens (" << rows
                                    << " rows padded to a multiple of " << alignment << ") but a batch holds tokens="
                                    << tokens << " rows: raise tokens to at least " << rows
                                    << " or split the document (thdcp plan: --long-docs split or truncate)");
    if (batch < 0 || used + rows > tokens) {
      ++batch;
      used = 0;
    }
    place(batch, i);
    used += rows;
  }
  THDCP_CHECK(batch >= 0, (documents.source.empty() ? std::string("the documents")
                                                     : source_name(documents.source, documents.lines))
                              << ": no documents to pack: give at least one length");
}

}  // namespace

DocumentBatches pack_documents(const DocumentLengths& documents, int64_t tokens, int64_t alignment) {
  DocumentBatches out;
  out.source = documents.source;
  // Counted first, so that the batch lists are allocated once at their size.
  if (alignment >= 1 && tokens >= alignment) {
    const PackingSize size = count_packing(documents, tokens, alignment, LongDocuments::kError);
    out.batches.reserve(static_cast<size_t>(size.batches));
    if (!documents.lines.empty()) out.lines.reserve(static_cast<size_t>(size.batches));
  }
  walk_packing(documents, tokens, alignment, [&](int64_t batch, size_t i) {
    if (batch == static_cast<int64_t>(out.batches.size())) {
      out.batches.emplace_back();
      if (i < documents.lines.size()) out.lines.push_back(documents.lines[i]);
    }
    out.batches.back().push_back(documents.lengths[i]);
  });
  return out;
}

std::vector<int64_t> packed_batch(const DocumentLengths& documents, int64_t tokens, int64_t alignment, int64_t index,
                                  int64_t* count) {
  std::vector<int64_t> lengths;
  int64_t batches = 0;
  walk_packing(documents, tokens, alignment, [&](int64_t batch, size_t i) {
    if (batch == index) lengths.push_back(documents.lengths[i]);
    batches = batch + 1;
  });
  if (count) *count = batches;
  return lengths;
}

DocumentLengths fit_long_documents(const DocumentLengths& documents, int64_t tokens, int64_t alignment,
                                   LongDocuments policy, int64_t* touched) {
  THDCP_CHECK(alignment >= 1 && tokens >= alignment,
              "tokens=" << tokens << " must be at least the packing alignment " << alignment);
  const int64_t longest = tokens / alignment * alignment;  // the most tokens one batch holds
  DocumentLengths out;
  out.source = documents.source;
  // Counted first (a split document can make many pieces): allocated once, at its size.
  const int64_t pieces = count_packing(documents, tokens, alignment, policy).documents;
  out.lengths.reserve(static_cast<size_t>(pieces));
  if (!documents.lines.empty()) out.lines.reserve(static_cast<size_t>(pieces));
  int64_t count = 0;
  for (size_t i = 0; i < documents.lengths.size(); ++i) {
    const int64_t length = documents.lengths[i];
    const bool has_line = i < documents.lines.size();
    auto add = [&](int64_t n) {
      out.lengths.push_back(n);
      if (has_line) out.lines.push_back(documents.lines[i]);
    };
    if (policy == LongDocuments::kError || length <= longest) {
      add(length);
      continue;
    }
    ++count;
    if (policy == LongDocuments::kTruncate) {
      add(longest);
    } else {
      for (int64_t at = 0; at < length; at += longest) add(std::min(longest, length - at));
    }
  }
  if (touched) *touched = count;
  return out;
}

PackingSize count_packing(const DocumentLengths& documents, int64_t tokens, int64_t alignment, LongDocuments policy) {
  THDCP_CHECK(alignment >= 1, "packing alignment " << alignment << " must be >= 1");
  THDCP_CHECK(tokens >= alignment, "tokens=" << tokens << " is smaller than the packing alignment " << alignment
                                             << " (lcm of 2*cp): raise tokens");
  const int64_t longest = tokens / alignment * alignment;
  PackingSize size;
  int64_t used = 0;
  // `count` documents of `length` each, packed as pack_documents packs them one by one: the
  // first where it fits, the rest filling batches of tokens / rows documents.
  const auto add = [&](int64_t length, int64_t count) {
    const int64_t rows = padded_to(length, alignment);
    size.documents += count;
    if (size.batches == 0 || used + rows > tokens) {
      ++size.batches;
      used = 0;
    }
    used += rows;
    if (--count == 0) return;
    if (rows > tokens) {  // kError: each is refused later; one batch each until then
      size.batches += count;
      return;
    }
    const int64_t into_this = std::min(count, (tokens - used) / rows);
    used += into_this * rows;
    count -= into_this;
    if (count == 0) return;
    const int64_t per_batch = tokens / rows;
    size.batches += (count + per_batch - 1) / per_batch;
    used = (count % per_batch == 0 ? per_batch : count % per_batch) * rows;
  };
  for (size_t i = 0; i < documents.lengths.size(); ++i) {
    const int64_t length = documents.lengths[i];
    THDCP_CHECK(length >= 1, where(documents.source, documents.lines, i)
                                 << "document " << i << " has length " << length << ": lengths must be >= 1");
    if (policy == LongDocuments::kError || length <= longest) {
      add(length, 1);
      continue;
    }
    ++size.touched;
    if (policy == LongDocuments::kTruncate) {
      add(longest, 1);
      continue;
    }
    add(longest, length / longest);
    if (length % longest != 0) add(length % longest, 1);
  }
  return size;
}

double planning_bytes(const PackingSize& size, double read_bytes) {
  const double documents = static_cast<double>(size.documents), batches = static_cast<double>(size.batches);
  // The fitted documents: a length and a line each (reserved exactly). The batches: a vector
  // and a line each (reserved exactly), their documents in a heap block that grows to at
  // most twice its count (8 bytes a length, 16 of allocator header, at least 32 bytes in
  // all); plan_capacity's documents-per-batch counts and one sorted copy of them.
  return read_bytes + 16 * documents + (24 + 8 + 32) * batches + 16 * documents + 16 * batches;
}

double document_bytes(const DocumentLengths& documents) {
  return 8.0 * static_cast<double>(documents.lengths.capacity() + documents.lines.capacity());
}

int64_t min_tokens_for(const DocumentBatches& batches, const std::vector<int>& cp_sizes) {
  const int64_t alignment = packing_alignment(cp_sizes);
  int64_t tokens = alignment;
  for (size_t b = 0; b < batches.batches.size(); ++b) {
    for (int cp : cp_sizes) {
      const int64_t rows = padded_to(batch_rows(batches.batches[b], 2 * static_cast<int64_t>(cp)), alignment);
      THDCP_CHECK(rows <= kMaxBatchRows, where(batches.source, batches.lines, b)
                                             << "batch " << b << " needs more than 2^31-1 rows with its documents "
                                             << "padded to multiples of 2*cp=" << 2 * static_cast<int64_t>(cp)
                                             << " (and the batch to " << alignment
                                             << "): no tokens holds it (int32 offsets); split the batch");
      tokens = std::max(tokens, rows);
    }
  }
  return tokens;
}

int64_t percentile_nearest_rank(std::vector<int64_t> values, int p) {
  THDCP_CHECK(!values.empty(), "percentile of an empty list: there are no batches");
  THDCP_CHECK(p > 0 && p <= 100, "percentile p=" << p << " must be in (0, 100]");
  std::sort(values.begin(), values.end());
  const int64_t n = static_cast<int64_t>(values.size());
  const int64_t rank = std::max<int64_t>(1, (p * n + 99) / 100);  // ceil(p * n / 100), exact in integers
  return values[rank - 1];
}

int64_t capacity_metadata_bytes(int64_t max_seqs) {
  THDCP_CHECK(max_seqs >= 1, "max_seqs=" << max_seqs << " must be >= 1");
  // A batch of at most 2^31-1 rows holds at most that many documents, plus the placeholder;
  // the bound also keeps the products below far from overflow.
  THDCP_CHECK(max_seqs <= kMaxBatchRows + 1,
              "max_seqs=" << max_seqs
                          << " is more sequences than a batch holds (int32 offsets: at most 2^31-1 rows, plus one "
                             "placeholder)");
  return 2 * (max_seqs + 1) * static_cast<int64_t>(sizeof(int32_t)) +
         2 * max_seqs * static_cast<int64_t>(sizeof(Segment));
}

CapacityPlan plan_capacity(const DocumentBatches& input, const PlanOptions& options) {
  // Also checks the CP sizes, and that 2*cp of each fits an int32 row count.
  const int64_t alignment = packing_alignment(options.cp_sizes);
  THDCP_CHECK(options.tokens >= 1, "tokens=" << options.tokens << " must be >= 1 (rows per batch)");
  THDCP_CHECK(options.tokens <= kMaxBatchRows, "tokens=" << options.tokens << " is more rows than a batch holds: "
                                                         << "layouts' offsets are int32, so lower tokens to at most "
                                                         << "2^31-1=" << kMaxBatchRows);
  THDCP_CHECK(options.fallback_budget >= 0 && options.fallback_budget <= 1,
              "fallback budget " << options.fallback_budget << " must be a fraction in [0, 1]");
  const std::string source = input.source.empty() ? std::string("the batches") : source_name(input.source, input.lines);
  THDCP_CHECK(!input.batches.empty(), source << ": no batches: give at least one");
  for (int cp : options.cp_sizes) {
    THDCP_CHECK(options.tokens % (2 * static_cast<int64_t>(cp)) == 0,
                "tokens=" << options.tokens << " is not a multiple of 2*cp=" << 2 * static_cast<int64_t>(cp)
                          << ": round it to a multiple of " << alignment);
  }
  for (size_t b = 0; b < input.batches.size(); ++b) {
    const auto& batch = input.batches[b];
    THDCP_CHECK(!batch.empty(), where(input.source, input.lines, b) << "batch " << b << " has no documents");
    for (int64_t length : batch) {
      THDCP_CHECK(length >= 1, where(input.source, input.lines, b) << "batch " << b << " has a document of length "
                                                                   << length << ": lengths must be >= 1");
    }
    for (int cp : options.cp_sizes) {
      const int64_t rows = batch_rows(batch, 2 * static_cast<int64_t>(cp));
      THDCP_CHECK(rows <= kMaxBatchRows, where(input.source, input.lines, b)
                                             << "batch " << b << " needs more than 2^31-1 rows with its documents "
                                             << "padded to multiples of 2*cp=" << 2 * static_cast<int64_t>(cp)
                                             << ": no tokens holds it (int32 offsets); split the batch");
      THDCP_CHECK(rows <= options.tokens, where(input.source, input.lines, b)
                                              << "batch " << b << " needs " << rows
                                              << " rows with its documents padded to multiples of 2*cp="
                                              << 2 * static_cast<int64_t>(cp) << " but tokens=" << options.tokens
                                              << ": raise tokens to at least " << rows);
    }
  }

  CapacityPlan plan;
  plan.tokens = options.tokens;
  plan.packing_alignment = alignment;
  plan.docs_per_batch = docs_per_batch(input);
  plan.layout_masks = options.layout_masks;
  const DocsPerBatch& d = plan.docs_per_batch;
  for (int cp : options.cp_sizes) {
    CpPlan p;
    p.cp = cp;
    const int64_t two_cp = 2 * static_cast<int64_t>(cp);
    for (const auto& batch : input.batches) {
      for (int64_t length : batch) {
        p.valid_tokens += length;
        p.padded_rows += padded_to(length, two_cp);
        p.longest_document = std::max(p.longest_document, length);
      }
    }
    p.padding_fraction = static_cast<double>(p.padded_rows - p.valid_tokens) / static_cast<double>(p.padded_rows);
    const double capacity_rows = static_cast<double>(d.batches) * static_cast<double>(options.tokens);
    p.slack_fraction = (capacity_rows - static_cast<double>(p.padded_rows)) / capacity_rows;
    p.longest_rows_per_rank = padded_to(p.longest_document, two_cp) / cp;
    p.candidates = {candidate("P90", d.p90, d.counts), candidate("P99", d.p99, d.counts),
                    candidate("max", d.max, d.counts), candidate("T/(2cp)", options.tokens / two_cp, d.counts)};
    p.balance = rank_balance(input.batches, cp, CpLayout::kDualChunk, options.mask);
    p.layouts = compare_layouts(input.batches, cp, options.layout_masks);
    recommend(p, options.fallback_budget);
    plan.per_cp.push_back(std::move(p));
  }
  return plan;
}

}  // namespace thdcp
