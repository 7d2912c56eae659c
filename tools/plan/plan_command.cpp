// `thdcp plan`: which capacity (max_seqs, max_tokens) to capture CUDA graphs for, and what
// it costs, from the document lengths of real batches.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "io/args.h"
#include "io/atomic_file.h"
#include "commands.h"
#include "io/json.h"
#include "io/memory_budget.h"
#include "plan/plan_report.h"
#include "thdcp/plan/planner.h"

namespace thdcp::tools {

namespace {

const char* kPlanHelp =
    "usage: thdcp plan (--lengths FILE | --batches FILE) [options]\n"
    "\n"
    "Recommends the capacity (max_seqs) of fixed-shape metadata for CUDA graphs, per CP size:\n"
    "padding overhead of the 2*cp alignment, documents per batch (P50/P90/P99/max), the\n"
    "fraction of batches that would fall back to eager for each candidate max_seqs, the\n"
    "metadata memory, and the causal (query,key) balance of the dual-chunk split. Then, per CP\n"
    "size, the CP layouts (dual_chunk, contiguous): the padding each adds, the busiest rank's\n"
    "(query,key) pairs over the mean per step for each mask (causal, full, each --window), and\n"
    "the layout recommended for each mask.\n"
    "\n"
    "options:\n"
    "  --lengths FILE    document lengths, one per line ('#' comments allowed), packed in order\n"
    "                    into batches of --tokens rows (each document padded to a multiple of\n"
    "                    lcm(2*cp) over --cp, so every CP size sees the same batches)\n"
    "  --long-docs P     with --lengths, a document longer than a batch: error (default), split\n"
    "                    (into batch-sized pieces) or truncate (to a batch); the report says how many\n"
    "  --batches FILE    one batch per line: its document lengths, separated by spaces or commas\n"
    "  --tokens T        rows per batch, the graphs' max_tokens (default 16384 with --lengths;\n"
    "                    with --batches the smallest that holds every batch)\n"
    "  --cp LIST         CP sizes, e.g. 1,2,4,8 (default)\n"
    "  --budget PCT      largest fallback rate the recommendation accepts, in % (default 1)\n"
    "  --window L[,L...] left windows (keys in [q-L, q]) to compare the CP layouts under, besides\n"
    "                    causal and full, e.g. 4096\n"
    "  --plot FILE.svg   histogram of documents per batch with the candidates, and rank balance\n"
    "  --json FILE       machine-readable results\n"
    "  --max-memory SIZE host memory the plan may take (e.g. 8G, 512M; default: the machine's, or\n"
    "                    what ulimit -v leaves); one estimated to need more is refused before it\n"
    "                    packs a batch\n";

std::vector<int> parse_cp_list(const std::string& text) {
  std::vector<int> sizes;
  for (int64_t c : parse_int_list("cp", text, 1, 1024)) sizes.push_back(static_cast<int>(c));
  return sizes;
}

std::string bytes_text(int64_t bytes) {
  char out[32];
  if (bytes < 10 * 1024) {
    std::snprintf(out, sizeof(out), "%lld B", static_cast<long long>(bytes));
  } else if (bytes < 10 * 1024 * 1024) {
    std::snprintf(out, sizeof(out), "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(out, sizeof(out), "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return out;
}

void print_plan(const CapacityPlan& plan, const DocumentBatches& batches) {
  const DocsPerBatch& d = plan.docs_per_batch;
  std::printf("thdcp plan: %lld batches of %lld rows from %s\n", static_cast<long long>(d.batches),
              static_cast<long long>(plan.tokens), quote_excerpt(batches.source, kPathExcerptChars).c_str());
  std::printf("documents per batch: mean %.1f, P50 %lld, P90 %lld, P99 %lld, max %lld (nearest-rank percentiles)\n",
              d.mean, static_cast<long long>(d.p50), static_cast<long long>(d.p90), static_cast<long long>(d.p99),
              static_cast<long long>(d.max));
  for (const CpPlan& p : plan.per_cp) {
    std::printf("\ncp=%d (sequences padded to multiples of %d)\n", p.cp, 2 * p.cp);
    std::printf("  padding overhead       %.3f%% of document rows (%lld rows for %lld tokens)\n",
                100.0 * p.padding_fraction, static_cast<long long>(p.padded_rows - p.valid_tokens),
                static_cast<long long>(p.valid_tokens));
    std::printf("  unused batch rows      %.2f%% (placeholder slack up to max_tokens)\n", 100.0 * p.slack_fraction);
    std::printf("  longest sequence       %lld tokens -> %lld rows on every rank\n",
                static_cast<long long>(p.longest_document), static_cast<long long>(p.longest_rows_per_rank));
    std::printf("  causal pair balance    max/mean over ranks: %.4f in total, %.4f per step, worst batch %.4f (batch %lld)\n",
                p.balance.total_max_over_mean, p.balance.step_max_over_mean, p.balance.worst_batch_max_over_mean,
                static_cast<long long>(p.balance.worst_batch));
    std::printf("  %-10s %9s %10s %12s %14s\n", "candidate", "max_seqs", "fallbacks", "fallback %", "metadata/rank");
    for (size_t i = 0; i < p.candidates.size(); ++i) {
      const CapacityCandidate& c = p.candidates[i];
      std::printf("  %-10s %9lld %10lld %11.2f%% %14s%s\n", c.label.c_str(), static_cast<long long>(c.max_seqs),
                  static_cast<long long>(c.fallback_batches), 100.0 * c.fallback_fraction,
                  bytes_text(c.metadata_bytes).c_str(), static_cast<int>(i) == p.recommended ? "  <- recommended" : "");
    }
    std::printf("  recommendation (max_tokens=%lld): %s\n", static_cast<long long>(plan.tokens), p.reason.c_str());
  }
}

// The CP layouts section: per CP size, each layout's padding and balance under each mask, and
// the layout recommended for each mask.
void print_layouts(const CapacityPlan& plan) {
  std::printf("\nCP layouts: padding rows each adds, and the busiest rank's (query,key) pairs over the mean\n"
              "per step (1.0000 = balanced; the same batches as above)\n");
  std::vector<std::string> labels;
  for (const Mask& m : plan.layout_masks) labels.push_back(layout_mask_label(m));
  for (const CpPlan& p : plan.per_cp) {
    std::printf("\ncp=%d\n  %-12s %14s %9s", p.cp, "layout", "padding rows", "% tokens");
    for (const std::string& label : labels) std::printf(" %12s", label.c_str());
    std::printf("\n");
    for (const LayoutPlan& l : p.layouts.layouts) {
      std::printf("  %-12s %14lld %8.3f%%", cp_layout_name(l.layout), static_cast<long long>(l.padding_rows),
                  100.0 * l.padding_fraction);
      for (const RankBalance& b : l.balance) std::printf(" %12.4f", b.step_max_over_mean);
      std::printf("\n");
    }
    for (size_t m = 0; m < p.layouts.choices.size(); ++m) {
      std::printf("  recommended for %s: %s (%s)\n", labels[m].c_str(), cp_layout_name(p.layouts.choices[m].layout),
                  p.layouts.choices[m].reason.c_str());
    }
  }
}

// Before the batches are built: what planning `size` holds at its peak (the planner's
// structures, and the per-batch entries of --json and --plot) against the memory budget.
void check_plan_memory(const Args& args, double max_memory, const PackingSize& size, double read_bytes,
                       const std::string& policy) {
  const double batches = static_cast<double>(size.batches);
  MemoryNeed need;
  need.buffers = planning_bytes(size, read_bytes);
  // --json: a Json value per batch in an array that grows to twice its size, and its text
  // (twice: dumped, then staged); --plot: the histogram's copy of the counts.
  if (args.has("json")) need.buffers += batches * (2 * sizeof(Json) + 2 * 24);
  if (args.has("plot")) need.buffers += batches * 8;
  const std::string source = args.has("lengths") ? "--lengths " + quote_excerpt(args.get("lengths", ""), kPathExcerptChars)
                                                 : "--batches " + quote_excerpt(args.get("batches", ""), kPathExcerptChars);
  std::string details = source + ": " + std::to_string(size.documents) + " documents in " +
                        std::to_string(size.batches) + " batches";
  if (size.touched > 0) {
    details += ", " + std::to_string(size.touched) + " long document(s) " +
               (policy == "split" ? "split into pieces" : "truncated") + " by --long-docs " + policy;
  }
  const std::string change = policy == "split" ? "raise --tokens, use --long-docs truncate, or give fewer lengths"
                             : args.has("lengths") ? "raise --tokens or give fewer lengths"
                                                   : "give fewer batches";
  check_memory_budget(need, max_memory, "thdcp plan", details, change);
}

}  // namespace

int plan_command(const std::vector<std::string>& argv) {
  const Args args(argv, {"lengths", "batches", "tokens", "cp", "budget", "plot", "json", "long-docs", "max-memory",
                   "window"},
                  {"help"});
  if (args.has("help")) {
    std::fputs(kPlanHelp, stdout);
    return 0;
  }
  if (args.has("lengths") == args.has("batches")) {
    throw UsageError("give exactly one of --lengths FILE and --batches FILE (see thdcp plan --help)");
  }
  if (args.has("json") && args.has("plot")) {
    check_distinct_outputs({{"json", args.get("json", "")}, {"plot", args.get("plot", "")}});
  }
  if (args.has("json")) check_output_file("json", args.get("json", ""));
  if (args.has("plot")) check_output_file("plot", args.get("plot", ""));
  const double max_memory = args.has("max-memory") ? parse_bytes("max-memory", args.get("max-memory", "")) : 0;
  PlanOptions options;
  options.cp_sizes = args.has("cp") ? parse_cp_list(args.get("cp", "")) : std::vector<int>{1, 2, 4, 8};
  options.fallback_budget = static_cast<double>(args.get_int("budget", 1, 0, 100)) / 100.0;
  if (args.has("window")) {
    for (int64_t left : parse_int_list("window", args.get("window", ""), 0, INT32_MAX)) {
      options.layout_masks.push_back(Mask::window(static_cast<int32_t>(left), 0));
    }
  }
  if (args.has("long-docs") && !args.has("lengths")) throw UsageError("--long-docs applies to --lengths: give --lengths");
  DocumentBatches batches;
  std::string long_docs_note;
  if (args.has("lengths")) {
    options.tokens = args.get_int("tokens", 16384, 1, INT32_MAX);
    const std::string policy = args.get("long-docs", "error");
    if (policy != "error" && policy != "split" && policy != "truncate") {
      throw UsageError("--long-docs " + quote_excerpt(policy) + ": use error, split or truncate");
    }
    const LongDocuments long_docs = policy == "split"      ? LongDocuments::kSplit
                                    : policy == "truncate" ? LongDocuments::kTruncate
                                                           : LongDocuments::kError;
    const int64_t alignment = packing_alignment(options.cp_sizes);
    check_tokens_multiple(options.tokens, alignment, "lcm(2*cp)=" + std::to_string(alignment));
    DocumentLengths read = read_lengths_file(args.get("lengths", ""));
    // Counted before anything is built: a long document split for small batches makes a piece
    // and a batch per --tokens of it.
    const PackingSize size = count_packing(read, options.tokens, alignment, long_docs);
    check_plan_memory(args, max_memory, size, document_bytes(read), policy);
    const DocumentLengths documents = fit_long_documents(read, options.tokens, alignment, long_docs);
    read = DocumentLengths{};
    if (size.touched > 0) {
      long_docs_note = std::to_string(size.touched) + " document(s) longer than a batch (" +
                       std::to_string(options.tokens / alignment * alignment) + " tokens) were " +
                       (long_docs == LongDocuments::kSplit ? "split into batch-sized pieces" : "truncated") +
                       " (--long-docs " + policy + ")";
    }
    batches = pack_documents(documents, options.tokens, alignment);
  } else {
    check_plan_memory(args, max_memory, count_batches_file(args.get("batches", "")), 0, "");
    batches = read_batches_file(args.get("batches", ""));
    options.tokens = args.has("tokens") ? args.get_int("tokens", 0, 1, INT32_MAX)
                                        : min_tokens_for(batches, options.cp_sizes);
    const int64_t alignment = packing_alignment(options.cp_sizes);
    check_tokens_multiple(options.tokens, alignment, "lcm(2*cp)=" + std::to_string(alignment));
  }
  const CapacityPlan plan = plan_capacity(batches, options);
  {
    // Both outputs or neither.
    OutputSet out;
    if (args.has("json")) {
      Json summary = plan_json(plan);
      summary.set("command", "plan").set("source", batches.source);
      out.stage_file(args.get("json", ""), summary.dump(2) + "\n");
    }
    if (args.has("plot")) out.stage_file(args.get("plot", ""), plan_svg(plan));
    out.commit();
  }
  print_plan(plan, batches);
  print_layouts(plan);
  if (!long_docs_note.empty()) std::printf("\n%s\n", long_docs_note.c_str());
  if (args.has("plot")) {
    std::printf("\nplot written to %s\n", quote_excerpt(args.get("plot", ""), kPathExcerptChars).c_str());
  }
  return 0;
}

}  // namespace thdcp::tools
