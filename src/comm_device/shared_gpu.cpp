#include "thdcp/comm_device/shared_gpu.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "thdcp/comm/rank_threads.h"
#include "shared_gpu_kernels.h"
#include "stream_capture.h"
#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"

namespace thdcp {

namespace {

enum class Op { kAllGather, kReduceScatter, kAllReduceMax, kAllToAll, kSplit, kCapture, kLaunch };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter_sum";
    case Op::kAllReduceMax: return "all_reduce_max";
    case Op::kAllToAll: return "all_to_all";
    case Op::kSplit: return "split";
    case Op::kCapture: return "begin_capture/end_capture";
    case Op::kLaunch: return "launch";
  }
  return "?";
}

// Keeps the caller's current device across a call that must run on another one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    THDCP_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) THDCP_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

// What one rank publishes for the collective in flight. Stable between the two rendezvous
// of a collective: no rank can publish the next one before every rank passed the second.
struct Slot {
  Op op = Op::kAllGather;
  size_t bytes = 0;
  const void* send = nullptr;
  int color = 0, key = 0;
};

namespace {

// Rank r's GPU: options.devices[r], or options.device for every rank.
std::vector<int> rank_devices(int size, const SharedGpuOptions& options) {
  THDCP_CHECK(options.devices.empty() || static_cast<int>(options.devices.size()) == size,
              "SharedGpuOptions::devices has " << options.devices.size() << " entries for a group of " << size
                                               << " ranks: give one GPU per rank, or none (every rank on device "
                                               << options.device << ")");
  return options.devices.empty() ? std::vector<int>(static_cast<size_t>(std::max(size, 0)), options.device)
                                 : options.devices;
}

// Peer access from every device of the group to every other (an error names a pair that has
// none: those GPUs need NCCL).
void enable_peer_access(const std::vector<int>& devices) {
  for (int from : devices) {
    for (int to : devices) {
      if (from == to) continue;
      int can = 0;
      THDCP_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, from, to));
      THDCP_CHECK(can != 0, "GPU " << from << " cannot access the memory of GPU " << to
                                   << " (no peer-to-peer path): a peer-copy group needs it between every pair; use "
                                      "NCCL (nccl::create) for these GPUs");
      DeviceGuard guard(from);
      const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clear it: enabled before is what we want
      } else {
        THDCP_CHECK_CUDA(status);
      }
    }
  }
}

}  // namespace

struct SharedGpuGroup::State {
  State(int size_, const SharedGpuOptions& options_)
      : size(size_), options(options_), devices(rank_devices(size_, options_)), slots(size_) {
    THDCP_CHECK(size >= 1 && size <= detail::kSharedGpuMaxRanks,
                "shared-GPU group size " << size << " must be in [1, " << detail::kSharedGpuMaxRanks << "]");
    THDCP_CHECK(options.reduce_scratch_bytes % sizeof(float) == 0,
                "reduce_scratch_bytes=" << options.reduce_scratch_bytes << " must be a multiple of 4");
    int visible = 0;
    THDCP_CHECK_CUDA(cudaGetDeviceCount(&visible));
    for (int d : devices) {
      THDCP_CHECK(d >= 0 && d < visible,
                  "shared-GPU device " << d << " does not exist: " << visible << " CUDA devices are visible");
    }
    peer_copy = std::any_of(devices.begin(), devices.end(), [&](int d) { return d != devices[0]; });
    if (peer_copy) enable_peer_access(devices);
    ready.resize(size);
    done.resize(size);
    join.resize(size);
    scratch.resize(size);
    for (int r = 0; r < size; ++r) {
      DeviceGuard guard(devices[static_cast<size_t>(r)]);  // a rank's events and scratch live on its GPU
      THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&ready[r], cudaEventDisableTiming));
      THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&done[r], cudaEventDisableTiming));
      THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
      if (options.reduce_scratch_bytes > 0) {
        THDCP_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch[r]), options.reduce_scratch_bytes));
      }
    }
  }

  ~State() {
    for (cudaEvent_t e : ready) if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : done) if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : join) if (e) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    if (origin) cudaStreamDestroy(origin);
    for (float* s : scratch) if (s) cudaFree(s);
  }

  // Blocks until every rank has arrived (or throws once the group is aborted, or after the
  // timeout, which aborts it).
  void rendezvous(int rank, Op op) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!abort_reason.empty()) throw Error("shared-GPU rank " + std::to_string(rank) + ": " + abort_reason,
                                           ErrorKind::kCommunication);
    const long generation_at_entry = generation;
    arrived_mask[rank] = true;
    if (++arrived == size) {
      arrived = 0;
      std::fill(arrived_mask.begin(), arrived_mask.end(), false);
      ++generation;
      cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(options.timeout_seconds > 0 ? options.timeout_seconds : 1e9));
    const bool released = cv.wait_until(lock, deadline, [&] {
      return generation != generation_at_entry || !abort_reason.empty();
    });
    if (generation != generation_at_entry) return;
    if (released) throw Error("shared-GPU rank " + std::to_string(rank) + ": " + abort_reason,
                              ErrorKind::kCommunication);
    std::ostringstream why;
    why << "rank " << rank << " waited " << options.timeout_seconds << " s in " << op_name(op)
        << " for ranks that never called it:";
    for (int r = 0; r < size; ++r) {
      if (!arrived_mask[r]) why << " " << r;
    }
    why << " (a peer failed, hangs, or called another collective); collective abandoned";
    abort_reason = why.str();
    cv.notify_all();
    throw Error("shared-GPU rank " + std::to_string(rank) + ": " + abort_reason, ErrorKind::kCommunication);
  }

  // Aborts this group and every group split from it (their ranks are this group's threads).
  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<State>> split_groups;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (abort_reason.empty()) abort_reason = reason;
      cv.notify_all();
      for (const auto& child : children) {
        if (auto group = child.lock()) split_groups.push_back(std::move(group));
      }
    }
    for (const auto& group : split_groups) group->abort(reason);
  }

  // After the first rendezvous: every rank must have called the same collective with the same
  // size. Every rank sees the same slots, so every rank throws the same message.
  void check_agreement(int rank) {
    const Slot& first = slots[0];
    for (int r = 1; r < size; ++r) {
      const Slot& s = slots[r];
      if (s.op == first.op && (s.bytes == first.bytes || s.op == Op::kSplit)) continue;
      std::ostringstream why;
      why << "rank " << r << " called " << op_name(s.op) << " with " << s.bytes << " bytes while rank 0 called "
          << op_name(first.op) << " with " << first.bytes
          << " bytes: every rank must call the same collectives in the same order with the same sizes";
      abort(why.str());
      throw Error("shared-GPU rank " + std::to_string(rank) + ": " + why.str(), ErrorKind::kCommunication);
    }
  }

  const int size;
  const SharedGpuOptions options;
  const std::vector<int> devices;  // rank r's GPU
  bool peer_copy = false;          // the ranks span more than one GPU
  std::vector<Slot> slots;
  std::vector<cudaEvent_t> ready, done;  // per rank: its input is ready; it finished reading peers
  std::vector<float*> scratch;           // per rank: all_reduce_max result before the write-back

  // Graphs: rank 0 captures on `origin`, forks every rank's stream from it (`fork`) and
  // joins them back (`join`); a replay is launched on `origin` and forks the ranks again.
  cudaStream_t origin = nullptr;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> join;
  cudaGraph_t captured = nullptr;  // rank 0's graph between the end rendezvous and its return
  std::string capture_error;       // why rank 0 could not end the capture ("" if it could)

  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  std::vector<bool> arrived_mask = std::vector<bool>(static_cast<size_t>(size), false);
  long generation = 0;
  std::string abort_reason;

  // Sub-groups being made by split(): keyed by (split generation, color), taken by each member.
  struct PendingSplit {
    std::shared_ptr<State> group;
    int remaining = 0;
  };
  std::map<std::pair<long, int>, PendingSplit> splits;
  std::vector<std::weak_ptr<State>> children;  // groups split from this one
};

namespace {

class SharedGpuCommunicator final : public DeviceCommunicator {
 public:
  SharedGpuCommunicator(std::shared_ptr<SharedGpuGroup::State> state, int rank) : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  int device() const override { return state_->devices[static_cast<size_t>(rank_)]; }
  const char* kind() const override { return state_->peer_copy ? "peer-copy" : "shared-gpu"; }

  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    State& s = *state_;
    begin(Op::kAllGather, bytes, send, stream);
    for (int r = 0; r < s.size; ++r) {
      if (bytes == 0) break;
      THDCP_CHECK_CUDA(cudaMemcpyAsync(static_cast<unsigned char*>(recv) + static_cast<size_t>(r) * bytes,
                                       s.slots[r].send, bytes, cudaMemcpyDefault, stream));
    }
    finish(stream);
  }

  // Rank r's block for this rank, from its send buffer (every rank's input is ready after
  // begin), into this rank's block r. (cudaMemcpyDefault: across GPUs, a peer copy.)
  void all_to_all(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    State& s = *state_;
    begin(Op::kAllToAll, bytes, send, stream);
    for (int r = 0; r < s.size; ++r) {
      if (bytes == 0) break;
      THDCP_CHECK_CUDA(cudaMemcpyAsync(static_cast<unsigned char*>(recv) + static_cast<size_t>(r) * bytes,
                                       static_cast<const unsigned char*>(s.slots[r].send) +
                                           static_cast<size_t>(rank_) * bytes,
                                       bytes, cudaMemcpyDefault, stream));
    }
    finish(stream);
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count, cudaStream_t stream) override {
    State& s = *state_;
    begin(Op::kReduceScatter, count * sizeof(float), send, stream);
    detail::launch_sum_over_ranks(peer_pointers(), s.size, static_cast<size_t>(rank_) * count, recv, count, stream);
    finish(stream);
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream) override {
    THDCP_CHECK(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
                "reduce_scatter_sum of " << dtype_name(dtype) << ": the 16-bit form takes bf16 or fp16");
    State& s = *state_;
    begin(Op::kReduceScatter, count * 2, send, stream);
    detail::launch_sum16_over_ranks(peer_pointers(), s.size, static_cast<size_t>(rank_) * count, recv, count,
                                    dtype == DType::kBFloat16, stream);
    finish(stream);
  }

  void all_reduce_max(float* data, size_t count, cudaStream_t stream) override {
    State& s = *state_;
    const size_t bytes = count * sizeof(float);
    THDCP_CHECK(bytes <= s.options.reduce_scratch_bytes,
                "all_reduce_max of " << count << " floats exceeds the shared-GPU scratch of "
                                     << s.options.reduce_scratch_bytes
                                     << " bytes: raise SharedGpuOptions::reduce_scratch_bytes");
    // `data` is input and output: reduce into scratch, and write back only once every peer
    // has read this rank's input (finish()).
    begin(Op::kAllReduceMax, bytes, data, stream);
    detail::launch_max_over_ranks(peer_pointers(), s.size, s.scratch[rank_], count, stream);
    finish(stream);
    if (bytes) THDCP_CHECK_CUDA(cudaMemcpyAsync(data, s.scratch[rank_], bytes, cudaMemcpyDeviceToDevice, stream));
  }

  std::unique_ptr<DeviceCommunicator> split(int color, int key) override {
    State& s = *state_;
    Slot& mine = s.slots[rank_];
    mine = Slot{Op::kSplit, 0, nullptr, color, key};
    s.rendezvous(rank_, Op::kSplit);
    s.check_agreement(rank_);
    std::vector<std::pair<int, int>> members;  // (key, old rank) of this color
    for (int r = 0; r < s.size; ++r) {
      if (color >= 0 && s.slots[r].color == color) members.emplace_back(s.slots[r].key, r);
    }
    std::sort(members.begin(), members.end());
    std::unique_ptr<DeviceCommunicator> result;
    std::exception_ptr failure;
    if (color >= 0) {
      const int new_rank = static_cast<int>(std::find_if(members.begin(), members.end(),
                                                         [&](const auto& m) { return m.second == rank_; }) -
                                            members.begin());
      try {
        std::shared_ptr<State> group;
        {
          std::lock_guard<std::mutex> lock(s.mutex);
          auto& pending = s.splits[{s.generation, color}];
          if (!pending.group) {
            SharedGpuOptions options = s.options;
            if (!options.devices.empty()) {
              options.devices.clear();
              for (const auto& member : members) options.devices.push_back(s.devices[static_cast<size_t>(member.second)]);
            }
            pending.group = std::make_shared<State>(static_cast<int>(members.size()), options);
            pending.remaining = static_cast<int>(members.size());
            s.children.push_back(pending.group);
          }
          group = pending.group;
          if (--pending.remaining == 0) s.splits.erase({s.generation, color});
        }
        result = std::make_unique<SharedGpuCommunicator>(std::move(group), new_rank);
      } catch (...) {
        failure = std::current_exception();
        s.abort("rank " + std::to_string(rank_) + " failed to create its split group");
      }
    }
    s.rendezvous(rank_, Op::kSplit);
    if (failure) std::rethrow_exception(failure);
    return result;
  }

  // One graph for the group: rank 0 begins capturing on the group's origin stream and every
  // rank's stream joins the capture through the fork event.
  void begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) override {
    State& s = *state_;
    check_device();
    meet(Op::kCapture);
    if (rank_ == 0) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.capture_error.clear();
      if (!s.origin) {
        THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&s.origin, cudaStreamNonBlocking));
        THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming));
      }
    }
    meet(Op::kCapture, false);  // origin exists before rank 0 records on it
    if (rank_ == 0) {
      THDCP_CHECK_CUDA(cudaStreamBeginCapture(s.origin, mode));
      THDCP_CHECK_CUDA(cudaEventRecord(s.fork, s.origin));
    }
    meet(Op::kCapture, false);  // fork recorded in the capture before anyone waits on it
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, s.fork, 0));
  }

  // Rank 0 ends the group's capture (the other ranks' streams leave it with it).
  void abandon_capture(cudaStream_t stream) noexcept override {
    if (rank_ == 0 && state_->origin) detail::discard_stream_capture(state_->origin);
    detail::discard_stream_capture(stream);
  }

  cudaGraph_t end_capture(cudaStream_t stream) override {
    State& s = *state_;
    // A rank whose stream is no longer in the capture (CUDA invalidated it) records its join
    // outside it; rank 0's end then fails and says so to every rank.
    const cudaError_t joined = cudaEventRecord(s.join[rank_], stream);
    if (joined != cudaSuccess) {
      cudaGetLastError();
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.capture_error.empty()) {
        s.capture_error = "rank " + std::to_string(rank_) + " could not join the graph capture: " +
                          cudaGetErrorName(joined) + " (" + cudaGetErrorString(joined) + ")";
      }
    }
    meet(Op::kCapture);
    if (rank_ == 0) {
      for (int r = 1; r < s.size; ++r) cudaStreamWaitEvent(s.origin, s.join[r], 0);
      cudaStreamWaitEvent(s.origin, s.join[0], 0);
      s.captured = nullptr;
      try {
        s.captured = detail::end_stream_capture(s.origin, 0);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(s.mutex);
        s.capture_error = e.what() + (s.capture_error.empty() ? std::string() : "; " + s.capture_error);
      }
    }
    meet(Op::kCapture, false);  // rank 0 has ended the capture: every stream is free
    std::string why;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      why = s.capture_error;
    }
    if (!why.empty()) {
      if (rank_ == 0 && s.captured) cudaGraphDestroy(s.captured);
      throw Error("shared-GPU rank " + std::to_string(rank_) + ": the group's capture failed: " + why,
                  ErrorKind::kCommunication);
    }
    return rank_ == 0 ? s.captured : nullptr;
  }

  void launch(cudaGraphExec_t exec, cudaStream_t stream) override {
    State& s = *state_;
    check_device();
    THDCP_CHECK(rank_ != 0 || exec != nullptr,
                "shared-GPU rank 0: launch needs the group's instantiated graph, not nullptr");
    THDCP_CHECK_CUDA(cudaEventRecord(s.join[rank_], stream));
    meet(Op::kLaunch);
    if (rank_ == 0) {
      for (int r = 0; r < s.size; ++r) THDCP_CHECK_CUDA(cudaStreamWaitEvent(s.origin, s.join[r], 0));
      THDCP_CHECK_CUDA(cudaGraphLaunch(exec, s.origin));
      THDCP_CHECK_CUDA(cudaEventRecord(s.fork, s.origin));
    }
    meet(Op::kLaunch, false);
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, s.fork, 0));
  }

  void warm_up(cudaStream_t stream) override {
    // Nothing connects lazily; one collective checks that every rank is there.
    all_gather(nullptr, nullptr, 0, stream);
    synchronize(stream, state_->options.timeout_seconds);
  }

  void synchronize(cudaStream_t stream, double timeout_seconds) override {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) THDCP_CHECK_CUDA(status);
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (!state_->abort_reason.empty()) {
          throw Error("shared-GPU rank " + std::to_string(rank_) + ": " + state_->abort_reason,
                      ErrorKind::kCommunication);
        }
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_seconds > 0 && waited > timeout_seconds) {
        const std::string why = "rank " + std::to_string(rank_) + " timed out after " + std::to_string(timeout_seconds) +
                                " s waiting for its stream";
        state_->abort(why);
        throw Error("shared-GPU " + why, ErrorKind::kCommunication);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  using State = SharedGpuGroup::State;

  // A rendezvous with no payload. The first of an operation publishes it and checks that
  // every rank is in the same one; later ones of the same operation only meet (a slot is
  // rewritten only once every rank has passed the check of the previous operation).
  void meet(Op op, bool first = true) {
    State& s = *state_;
    if (first) s.slots[rank_] = Slot{op, 0, nullptr, 0, 0};
    s.rendezvous(rank_, op);
    if (first) s.check_agreement(rank_);
  }

  // Publishes this rank's input, marks it ready on `stream`, meets the peers, and orders
  // `stream` after every peer's input.
  void begin(Op op, size_t bytes, const void* send, cudaStream_t stream) {
    State& s = *state_;
    check_device();
    s.slots[rank_] = Slot{op, bytes, send, 0, 0};
    THDCP_CHECK_CUDA(cudaEventRecord(s.ready[rank_], stream));
    s.rendezvous(rank_, op);
    s.check_agreement(rank_);
    for (int r = 0; r < s.size; ++r) {
      if (r != rank_) THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, s.ready[r], 0));
    }
  }

  // Marks this rank's reads done, meets the peers, and orders `stream` after every peer's
  // reads, so this rank may overwrite its input once the call returns.
  void finish(cudaStream_t stream) {
    State& s = *state_;
    THDCP_CHECK_CUDA(cudaEventRecord(s.done[rank_], stream));
    s.rendezvous(rank_, s.slots[rank_].op);
    for (int r = 0; r < s.size; ++r) {
      if (r != rank_) THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, s.done[r], 0));
    }
  }

  detail::RankPointers peer_pointers() const {
    detail::RankPointers p{};
    for (int r = 0; r < state_->size; ++r) p.rank[r] = static_cast<const float*>(state_->slots[r].send);
    return p;
  }

  void check_device() const {
    int current = 0;
    THDCP_CHECK_CUDA(cudaGetDevice(&current));
    THDCP_CHECK(current == device(), "shared-GPU rank " << rank_ << ": the current device is " << current
                                                        << " but this rank lives on device " << device()
                                                        << ": call cudaSetDevice(" << device() << ") in this thread");
  }

  std::shared_ptr<State> state_;
  int rank_;
};

}  // namespace

SharedGpuGroup::SharedGpuGroup(int size, const SharedGpuOptions& options)
    : state_(std::make_shared<State>(size, options)) {}

SharedGpuGroup::~SharedGpuGroup() = default;

int SharedGpuGroup::size() const { return state_->size; }

std::unique_ptr<DeviceCommunicator> SharedGpuGroup::communicator(int rank) {
  THDCP_CHECK(rank >= 0 && rank < state_->size, "rank=" << rank << " must be in [0, " << state_->size << ")");
  return std::make_unique<SharedGpuCommunicator>(state_, rank);
}

void SharedGpuGroup::abort(const std::string& reason) { state_->abort(reason); }

void run_shared_gpu(SharedGpuGroup& group, const std::function<void(DeviceCommunicator&)>& body) {
  const int size = group.size();
  std::vector<std::exception_ptr> failures(static_cast<size_t>(size));
  auto rank_main = [&](int rank) {
    try {
      std::unique_ptr<DeviceCommunicator> comm = group.communicator(rank);
      THDCP_CHECK_CUDA(cudaSetDevice(comm->device()));
      body(*comm);
    } catch (const std::exception& e) {
      failures[static_cast<size_t>(rank)] = std::current_exception();
      group.abort("rank " + std::to_string(rank) + " failed (" + e.what() + "); collective abandoned");
    } catch (...) {
      failures[static_cast<size_t>(rank)] = std::current_exception();
      group.abort("rank " + std::to_string(rank) + " failed; collective abandoned");
    }
  };
  detail::run_rank_threads(size, rank_main, [&](const std::string& why) { group.abort(why); }, "shared-GPU group");
  // The exception that caused the abort, not the "rank N failed" ones it set off.
  detail::rethrow_root_failure(failures, "collective abandoned");
}

void run_shared_gpu(int size, const std::function<void(DeviceCommunicator&)>& body, const SharedGpuOptions& options) {
  SharedGpuGroup group(size, options);
  run_shared_gpu(group, body);
}

}  // namespace thdcp
