// Graph banks of the C ABI: thdcp::graph::GraphBank with the work as a C callback. Builds
// without CUDA refuse to make a bank (THDCP_ERROR_UNSUPPORTED), so there every other call
// gets a handle that is not live.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capi_convert.h"
#include "capi_handles.h"
#include "capi_status.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/graph/graph_bank.h"
#endif

namespace thdcp::capi {

// What a thdcp_graph_bank_t stands for. It holds its communicator, declared first so that it
// outlives the bank.
struct GraphBank {
  std::shared_ptr<Comm> comm;
#if defined(THDCP_HAVE_CUDA)
  std::unique_ptr<graph::GraphBank> bank;
#endif
};

namespace {

const thdcp_graph_bank_params kDefaults = THDCP_GRAPH_BANK_PARAMS_INIT;

// The bank of `handle` for a collective call, its communicator into `group` (to abort).
std::shared_ptr<GraphBank> collective_bank(thdcp_graph_bank_t handle, std::shared_ptr<Comm>& group) {
  std::shared_ptr<GraphBank> bank = lookup<GraphBank>(handle, "bank");
  group = bank->comm;
  return bank;
}

#if defined(THDCP_HAVE_CUDA)
Capacity capacity_of(const thdcp_capacity_t* capacity) {
  THDCP_CAPI_NOT_NULL(capacity, "a thdcp_capacity_t (max_tokens, max_seqs)");
  return Capacity{capacity->max_seqs, capacity->max_tokens};
}

thdcp_graph_how_t how_of(graph::GraphBank::How how) {
  switch (how) {
    case graph::GraphBank::How::kWarmUp: return THDCP_GRAPH_WARM_UP;
    case graph::GraphBank::How::kCaptured: return THDCP_GRAPH_CAPTURED;
    case graph::GraphBank::How::kReplayed: return THDCP_GRAPH_REPLAYED;
    case graph::GraphBank::How::kFallback: return THDCP_GRAPH_FALLBACK;
  }
  return THDCP_GRAPH_WARM_UP;
}

void run(GraphBank& bank, const int64_t* lengths, int64_t num_documents, const int32_t* start_offsets,
         thdcp_graph_work_fn work, void* user_data, thdcp_stream_t stream, thdcp_graph_how_t* how,
         thdcp_capacity_t* capacity) {
  const std::vector<int64_t> docs = lengths_of(lengths, num_documents, "lengths");
  checked_padded_rows(docs, bank.comm->size(), "lengths");
  std::vector<int32_t> offsets;
  if (start_offsets) offsets.assign(start_offsets, start_offsets + num_documents);
  THDCP_CAPI_NOT_NULL(work, "a thdcp_graph_work_fn that enqueues the step");
  // The callback's failure, kept so that run() returns its status rather than the bank's
  // wrapping of it.
  thdcp_status_t work_status = THDCP_SUCCESS;
  const graph::Work step = [&](const graph::StaticBatch& batch, cudaStream_t s) {
    thdcp_static_batch_info info{};
    info.struct_size = sizeof(info);
    const DeviceLayout layout = batch.layout();
    info.layout.cu_seqlens = layout.cu_seqlens;
    info.layout.cu_seqlens_padded = layout.cu_seqlens_padded;
    info.layout.num_seqs = batch.capacity().max_seqs;
    info.start_offsets = batch.start_offsets();
    info.capacity.max_tokens = batch.capacity().max_tokens;
    info.capacity.max_seqs = batch.capacity().max_seqs;
    info.cp_size = batch.cp();
    const int status = raw_enum(work(&info, s, user_data));
    if (status != THDCP_SUCCESS) {
      const bool known = status > THDCP_SUCCESS && status <= kLastStatus;
      work_status = known ? static_cast<thdcp_status_t>(status) : THDCP_ERROR_INVALID_ARGUMENT;
      throw ApiError(work_status, "the work callback returned " +
                                      (known ? std::string(thdcp_status_name(work_status))
                                             : std::to_string(status) + ", which is not a thdcp_status_t") +
                                      " (the last error on this thread: " + thdcp_last_error() + ")");
    }
  };
  graph::GraphBank::Outcome outcome;
  try {
    outcome = bank.bank->run(docs, step, stream, offsets);
  } catch (const std::exception& e) {
    if (work_status == THDCP_SUCCESS) throw;
    throw ApiError(work_status, e.what());
  }
  if (how) *how = how_of(outcome.how);
  if (capacity) {
    capacity->max_tokens = outcome.capacity.max_tokens;
    capacity->max_seqs = outcome.capacity.max_seqs;
  }
}
#endif

}  // namespace

}  // namespace thdcp::capi

using thdcp::capi::Comm;
using thdcp::capi::guarded;

extern "C" {

thdcp_status_t thdcp_graph_bank_create(thdcp_communicator_t comm, const thdcp_graph_bank_params* params,
                                       thdcp_graph_bank_t* bank) {
  return guarded(__func__, [&] {
    const std::shared_ptr<Comm> c = thdcp::capi::lookup<Comm>(comm, "comm");
    const thdcp_graph_bank_params p =
        params ? thdcp::capi::read_params(params, THDCP_GRAPH_BANK_PARAMS_MIN_SIZE, thdcp::capi::kDefaults, "params",
                                          "thdcp_graph_bank_params",
                                          "THDCP_GRAPH_BANK_PARAMS_INIT or thdcp_graph_bank_params_init()")
               : thdcp::capi::kDefaults;
    THDCP_CAPI_REQUIRE(p.warmup_runs >= 1, "params->warmup_runs=" << p.warmup_runs
                                                                  << " must be >= 1: plans are made and kernels loaded "
                                                                     "in an eager run, never during a capture");
    THDCP_CAPI_NOT_NULL(bank, "a thdcp_graph_bank_t to receive the bank");
    thdcp::capi::require_cuda_device("graph banks");
    THDCP_CAPI_REQUIRE(c->is_device(), "comm is a host communicator (" << c->kind()
                                                                       << "): a graph bank needs a device "
                                                                          "communicator (NCCL or a shared-GPU group)");
#if defined(THDCP_HAVE_CUDA)
    thdcp::graph::BankOptions options;
    options.warmup_runs = p.warmup_runs;
    options.capture_mode = p.thread_local_capture ? cudaStreamCaptureModeThreadLocal : cudaStreamCaptureModeGlobal;
    auto made = std::make_shared<thdcp::capi::GraphBank>();
    made->comm = c;
    made->bank = std::make_unique<thdcp::graph::GraphBank>(*c->device, options);
    *bank = thdcp::capi::publish(std::move(made));
#endif
  });
}

thdcp_status_t thdcp_graph_bank_destroy(thdcp_graph_bank_t bank) {
  return guarded(__func__, [&] { thdcp::capi::retire<thdcp::capi::GraphBank>(bank, "bank"); });
}

thdcp_status_t thdcp_graph_bank_add_capacity(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<Comm>& group) {
    const auto live = thdcp::capi::collective_bank(bank, group);
#if defined(THDCP_HAVE_CUDA)
    live->bank->add_capacity(thdcp::capi::capacity_of(capacity));
#else
    (void)capacity;
#endif
  });
}

thdcp_status_t thdcp_graph_bank_buffer(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity, const char* name,
                                       size_t bytes, void** buffer) {
  return guarded(__func__, [&] {
    const auto live = thdcp::capi::lookup<thdcp::capi::GraphBank>(bank, "bank");
    THDCP_CAPI_NOT_NULL(name, "a NUL-terminated name of the buffer");
    THDCP_CAPI_NOT_NULL(buffer, "a void* to receive the device pointer");
#if defined(THDCP_HAVE_CUDA)
    *buffer = live->bank->buffer(thdcp::capi::capacity_of(capacity), name, bytes);
#else
    (void)capacity;
    (void)bytes;
#endif
  });
}

thdcp_status_t thdcp_graph_bank_run(thdcp_graph_bank_t bank, const int64_t* lengths, int64_t num_documents,
                                    const int32_t* start_offsets, thdcp_graph_work_fn work, void* user_data,
                                    thdcp_stream_t stream, thdcp_graph_how_t* how, thdcp_capacity_t* capacity) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<Comm>& group) {
    const auto live = thdcp::capi::collective_bank(bank, group);
#if defined(THDCP_HAVE_CUDA)
    thdcp::capi::run(*live, lengths, num_documents, start_offsets, work, user_data, stream, how, capacity);
#else
    (void)lengths, (void)num_documents, (void)start_offsets, (void)work, (void)user_data, (void)stream, (void)how,
        (void)capacity;
#endif
  });
}

thdcp_status_t thdcp_graph_bank_counters(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity,
                                         thdcp_graph_counters_t* counters) {
  return guarded(__func__, [&] {
    const auto live = thdcp::capi::lookup<thdcp::capi::GraphBank>(bank, "bank");
    THDCP_CAPI_NOT_NULL(counters, "a thdcp_graph_counters_t to receive the counters");
#if defined(THDCP_HAVE_CUDA)
    const thdcp::graph::KeyCounters c = live->bank->counters(thdcp::capi::capacity_of(capacity));
    counters->warmups = c.warmups;
    counters->captures = c.captures;
    counters->replays = c.replays;
    counters->fallbacks = c.fallbacks;
#else
    (void)capacity;
#endif
  });
}

thdcp_status_t thdcp_graph_bank_device_bytes(thdcp_graph_bank_t bank, size_t* bytes) {
  return guarded(__func__, [&] {
    const auto live = thdcp::capi::lookup<thdcp::capi::GraphBank>(bank, "bank");
    THDCP_CAPI_NOT_NULL(bytes, "a size_t to receive the bytes");
#if defined(THDCP_HAVE_CUDA)
    *bytes = live->bank->device_bytes();
#endif
  });
}

}  // extern "C"
