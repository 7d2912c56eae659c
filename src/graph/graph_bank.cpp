#include "thdcp/graph/graph_bank.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"

namespace thdcp::graph {

struct GraphBank::Entry {
  Entry(int cp, const Capacity& c, CpLayout layout)
      : capacity(c), batch(std::make_unique<StaticBatch>(cp, c, layout)) {}
  ~Entry() {
    if (exec) cudaGraphExecDestroy(exec);
    for (auto& named : buffers) cudaFree(named.second.first);
  }
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  size_t static_bytes() const {
    size_t bytes = batch->device_bytes();
    for (const auto& named : buffers) bytes += named.second.second;
    return bytes;
  }

  Capacity capacity;
  std::unique_ptr<StaticBatch> batch;
  std::map<std::string, std::pair<void*, size_t>> buffers;
  cudaGraphExec_t exec = nullptr;  // nullptr on a rank whose group's graph another rank launches
  bool captured = false;
  KeyCounters counters;
  size_t graph_bytes = 0;
};

namespace {

size_t free_device_bytes() {
  size_t free_bytes = 0, total = 0;
  THDCP_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

}  // namespace

GraphBank::GraphBank(DeviceCommunicator& comm, const BankOptions& options) : comm_(comm), options_(options) {
  THDCP_CHECK(options.warmup_runs >= 1, "BankOptions::warmup_runs=" << options.warmup_runs
                                            << " must be >= 1: the first run of a capacity makes plans, sets kernel "
                                               "attributes and loads modules, none of which may happen in a capture");
}

GraphBank::~GraphBank() = default;

const char* GraphBank::how_name(How how) {
  switch (how) {
    case How::kWarmUp: return "warm-up";
    case How::kCaptured: return "captured";
    case How::kReplayed: return "replayed";
    case How::kFallback: return "fallback";
  }
  return "?";
}

const GraphBank::Entry* GraphBank::find(const Capacity& capacity) const {
  for (const auto& e : entries_) {
    if (e->capacity == capacity) return e.get();
  }
  return nullptr;
}

GraphBank::Entry& GraphBank::entry(const Capacity& capacity) {
  if (const Entry* e = find(capacity)) return *const_cast<Entry*>(e);
  entries_.push_back(std::make_unique<Entry>(cp(), capacity, cp_layout()));
  return *entries_.back();
}

void GraphBank::add_capacity(const Capacity& capacity) {
  check_fit({}, cp(), capacity, cp_layout());  // validates it, naming what is wrong
  THDCP_CHECK(std::find(capacities_.begin(), capacities_.end(), capacity) == capacities_.end(),
              "capacity " << capacity_key_name(cp(), capacity) << " was already added");
  entry(capacity);
  capacities_.push_back(capacity);
}

void* GraphBank::buffer(const Capacity& capacity, const std::string& name, size_t bytes) {
  Entry& e = entry(capacity);
  auto it = e.buffers.find(name);
  if (it != e.buffers.end()) {
    THDCP_CHECK(bytes <= it->second.second, "buffer '" << name << "' of " << capacity_key_name(cp(), capacity)
                                                       << " has " << it->second.second << " bytes, asked for " << bytes
                                                       << ": ask for the largest size first");
    return it->second.first;
  }
  void* p = nullptr;
  THDCP_CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  THDCP_CHECK_CUDA(cudaMemset(p, 0, std::max<size_t>(bytes, 1)));
  // The zeroing runs on the legacy stream, which a caller's non-blocking stream does not wait
  // for: finish it here (plan time) so that an upload into the buffer cannot be overtaken.
  THDCP_CHECK_CUDA(cudaStreamSynchronize(nullptr));
  e.buffers.emplace(name, std::make_pair(p, bytes));
  return p;
}

std::vector<Capacity> GraphBank::run_capacities() const {
  std::vector<Capacity> out;
  for (const Capacity& c : capacities_) {
    for (const Capacity& run : {c, default_capacity(c.max_tokens, cp(), cp_layout())}) {
      if (std::find(out.begin(), out.end(), run) == out.end()) out.push_back(run);
    }
  }
  return out;
}

GraphBank::Outcome GraphBank::run(const std::vector<int64_t>& lengths, const Work& work, cudaStream_t stream,
                                  const std::vector<int32_t>& start_offsets) {
  THDCP_CHECK(!capacities_.empty(), "GraphBank::run: no capacity was added (add_capacity)");
  THDCP_CHECK(static_cast<bool>(work), "GraphBank::run: work is empty");
  Outcome outcome;
  const CapacityChoice choice = choose_capacity(capacities_, lengths, cp(), cp_layout());
  outcome.bucket = choice.bucket;
  outcome.capacity = choice.run;
  if (choice.fallback) {
    outcome.how = How::kFallback;
    Entry& fallback = entry(outcome.capacity);
    const Fit fit = fallback.batch->fill(lengths, stream, start_offsets);
    THDCP_CHECK(fit == Fit::kFits, "internal: a batch whose rows fit does not fit the zero-fallback capacity "
                                       << capacity_key_name(cp(), outcome.capacity) << " (" << fit_name(fit) << ")");
    work(*fallback.batch, stream);
    entry(outcome.bucket).counters.fallbacks += 1;
    return outcome;
  }
  Entry& e = entry(choice.run);
  e.batch->fill(lengths, stream, start_offsets);
  if (!e.captured && e.counters.warmups < options_.warmup_runs) {
    work(*e.batch, stream);
    e.counters.warmups += 1;
    outcome.how = How::kWarmUp;
    return outcome;
  }
  if (!e.captured) {
    const std::string key = capacity_key_name(cp(), e.capacity);
    comm_.begin_capture(stream, options_.capture_mode);
    try {
      work(*e.batch, stream);
    } catch (const std::exception& error) {
      comm_.abandon_capture(stream);
      THDCP_FAIL("capturing the graph of " << key << " failed: " << error.what()
                                           << " (captured work must only enqueue on the stream: no host "
                                              "synchronisation, allocation or read-back)");
    }
    cudaGraph_t graph = nullptr;
    try {
      graph = comm_.end_capture(stream);
    } catch (const std::exception& error) {
      THDCP_FAIL("capturing the graph of " << key << " failed: " << error.what());
    }
    if (graph) {
      THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
      const size_t before = free_device_bytes();
      const cudaError_t made = cudaGraphInstantiate(&e.exec, graph, 0);
      cudaGraphDestroy(graph);
      THDCP_CHECK_CUDA(made);
      THDCP_CHECK_CUDA(cudaGraphUpload(e.exec, stream));
      THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
      const size_t after = free_device_bytes();
      e.graph_bytes = before > after ? before - after : 0;
    }
    e.captured = true;
    e.counters.captures += 1;
    comm_.launch(e.exec, stream);
    outcome.how = How::kCaptured;
    return outcome;
  }
  comm_.launch(e.exec, stream);
  e.counters.replays += 1;
  outcome.how = How::kReplayed;
  return outcome;
}

KeyCounters GraphBank::counters(const Capacity& capacity) const {
  const Entry* e = find(capacity);
  return e ? e->counters : KeyCounters{};
}

std::vector<KeyReport> GraphBank::report() const {
  std::vector<KeyReport> out;
  for (const Capacity& c : capacities_) {
    const Entry& e = *find(c);
    KeyReport r;
    r.cp = cp();
    r.capacity = c;
    r.counters = e.counters;
    r.static_bytes = e.static_bytes();
    r.graph_bytes = e.graph_bytes;
    // The fallback capacity's buffers are memory this bucket holds too.
    const Capacity fallback = default_capacity(c.max_tokens, cp(), cp_layout());
    if (fallback != c) {
      if (const Entry* f = find(fallback)) r.static_bytes += f->static_bytes();
    }
    out.push_back(r);
  }
  return out;
}

size_t GraphBank::device_bytes() const {
  size_t bytes = 0;
  for (const auto& e : entries_) bytes += e->static_bytes() + e->graph_bytes;
  return bytes;
}

}  // namespace thdcp::graph
