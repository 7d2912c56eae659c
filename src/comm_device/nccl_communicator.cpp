// The NCCL device communicator (thdcp/comm_device/nccl.h).
//
// Every NCCL communicator made here is non-blocking (config.blocking = 0): init, split,
// finalize, and a collective whose connections NCCL is still making may return
// ncclInProgress and finish on NCCL's threads. Polling ncclCommGetAsyncError against a
// deadline, instead of blocking inside NCCL, is what lets a rank whose peer died or called
// something else abort and throw rather than hang.
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"

namespace thdcp::nccl {
namespace {

using Clock = std::chrono::steady_clock;

// Short enough that a small collective is seen finished within a fraction of its own
// latency budget; long enough not to keep a core busy that the step's host work needs.
constexpr std::chrono::microseconds kPollInterval{100};
constexpr int kSpinPolls = 1000;

// warm_up() runs each collective once on this many bytes per rank: enough for NCCL to make
// the connections that small collectives use, small enough to cost nothing.
constexpr size_t kWarmUpBytesPerRank = 4096;

class Deadline {
 public:
  // seconds <= 0 (or NaN): never passes. Capped at a century so the time point cannot overflow.
  explicit Deadline(double seconds) : limited_(seconds > 0) {
    if (limited_) {
      const std::chrono::duration<double> span(std::min(seconds, 3.2e9));
      end_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(span);
    }
  }
  bool passed() const { return limited_ && Clock::now() >= end_; }

 private:
  bool limited_;
  Clock::time_point end_{};
};

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

// NCCL's name for `result` and its last message, which says which call and why.
std::string describe(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(": ") + last;
  return text;
}

// Waits while `comm` reports ncclInProgress (a non-blocking call still running on NCCL's
// threads). Returns the final state, or ncclInProgress when the deadline passed first.
// A collective that NCCL is still issuing is usually issued within microseconds, so the
// first kSpinPolls polls only yield; sleeping kPollInterval at once would add a tenth of a
// millisecond of host time to every such call (and delay what the caller enqueues next).
ncclResult_t wait_while_in_progress(ncclComm_t comm, const Deadline& deadline) {
  for (int poll = 0;; ++poll) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess) return query;
    if (state != ncclInProgress) return state;
    if (deadline.passed()) return ncclInProgress;
    if (poll < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
}

// Makes `device` current for a scope of calls that are not on the capture path (split,
// warm_up, the destructor) and puts the caller's device back afterwards.
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    THDCP_CHECK_CUDA(cudaSetDevice(device));
  }
  ~CurrentDevice() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = -1;
};

// NCCL's copy-engine collectives (zero-CTA policy, symmetric windows, ncclAlltoAll) came in
// 2.28.3.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
#define THDCP_NCCL_COPY_ENGINE 1
#else
#define THDCP_NCCL_COPY_ENGINE 0
#endif

ncclConfig_t non_blocking_config(const Options& options) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (options.copy_engine) {
#if THDCP_NCCL_COPY_ENGINE
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#else
    THDCP_FAIL_AS(ErrorKind::kUnsupported, "nccl::Options::copy_engine needs NCCL 2.28.3 or later; thdcp was built with "
                                               << NCCL_MAJOR << "." << NCCL_MINOR << "." << NCCL_PATCH
                                               << ": rebuild against a newer NCCL, or leave copy_engine off");
#endif
  }
  return config;
}

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // Takes ownership of `comm` (owned) or borrows it (a caller's: never finalized, destroyed
  // or aborted here); its device must be current.
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, const Options& options, bool owned = true)
      : comm_(comm), rank_(rank), size_(size), device_(device), options_(options), owned_(owned) {
    // Allocated once here so that warm_up(), like every collective, allocates nothing.
    const size_t bytes = kWarmUpBytesPerRank * static_cast<size_t>(size_ + 1);
    cudaError_t status = cudaMalloc(&warm_up_buffer_, bytes);
    // Zeroed (and waited for: warm_up may run on a stream that does not wait for the
    // default one) so that the warm-up reads defined values.
    if (status == cudaSuccess) status = cudaMemset(warm_up_buffer_, 0, bytes);
    if (status == cudaSuccess) status = cudaStreamSynchronize(0);
    if (status == cudaSuccess && options_.copy_engine) status = make_copy_stream();
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      destroy_copy_stream();
      if (warm_up_buffer_ != nullptr) (void)cudaFree(warm_up_buffer_);
      if (owned_) (void)ncclCommAbort(comm_);
      THDCP_FAIL(who() << ": allocating the " << bytes << "-byte warm-up buffer failed: " << cudaGetErrorName(status)
                       << " (" << cudaGetErrorString(status)
                       << "); free device memory before creating the communicator");
    }
  }

  ~NcclCommunicator() override {
    int previous = -1;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    (void)cudaSetDevice(device_);
    if (comm_ != nullptr && owned_) release();
    destroy_copy_stream();
    (void)cudaFree(warm_up_buffer_);
    if (restore) (void)cudaSetDevice(previous);
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  const char* kind() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    check_usable("all_gather");
    // Zero bytes on one rank means zero on all (equal sizes are the caller's contract),
    // so every rank skips it alike.
    if (bytes == 0) return;
    check_current_device("all_gather");
    const cudaStream_t used = enter_copy_stream(stream);
    finish("ncclAllGather", ncclAllGather(send, recv, bytes, ncclUint8, comm_, used));
    leave_copy_stream(stream, used);
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count, cudaStream_t stream) override {
    check_usable("reduce_scatter_sum");
    if (count == 0) return;
    check_current_device("reduce_scatter_sum");
    finish("ncclReduceScatter", ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm_, stream));
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream) override {
    check_usable("reduce_scatter_sum");
    THDCP_CHECK(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
                who() << ": reduce_scatter_sum of " << dtype_name(dtype) << ": the 16-bit form takes bf16 or fp16");
    if (count == 0) return;
    check_current_device("reduce_scatter_sum");
    finish("ncclReduceScatter", ncclReduceScatter(send, recv, count,
                                                  dtype == DType::kBFloat16 ? ncclBfloat16 : ncclFloat16, ncclSum,
                                                  comm_, stream));
  }

  void all_reduce_max(float* data, size_t count, cudaStream_t stream) override {
    check_usable("all_reduce_max");
    if (count == 0) return;
    check_current_device("all_reduce_max");
    finish("ncclAllReduce", ncclAllReduce(data, data, count, ncclFloat32, ncclMax, comm_, stream));
  }

  // One group of a send and a receive per peer (itself included): capture-safe once warm_up
  // made the peer connections, which NCCL makes lazily on first use.
  void all_to_all(const void* send, void* recv, size_t bytes, cudaStream_t stream) override {
    check_usable("all_to_all");
    if (bytes == 0) return;
    check_current_device("all_to_all");
#if THDCP_NCCL_COPY_ENGINE
    // The collective, which NCCL runs on the copy engines where the buffers are in a window.
    if (options_.copy_engine) {
      const cudaStream_t used = enter_copy_stream(stream);
      finish("ncclAlltoAll", ncclAlltoAll(send, recv, bytes, ncclUint8, comm_, used));
      leave_copy_stream(stream, used);
      return;
    }
#endif
    ncclResult_t result = ncclGroupStart();
    for (int peer = 0; peer < size_ && (result == ncclSuccess || result == ncclInProgress); ++peer) {
      const size_t at = static_cast<size_t>(peer) * bytes;
      result = ncclSend(static_cast<const unsigned char*>(send) + at, bytes, ncclUint8, peer, comm_, stream);
      if (result == ncclSuccess || result == ncclInProgress) {
        result = ncclRecv(static_cast<unsigned char*>(recv) + at, bytes, ncclUint8, peer, comm_, stream);
      }
    }
    const ncclResult_t ended = ncclGroupEnd();
    finish("ncclSend/ncclRecv (all_to_all)", result == ncclSuccess || result == ncclInProgress ? ended : result);
  }

  std::unique_ptr<DeviceCommunicator> split(int color, int key) override {
    check_usable("split");
    CurrentDevice current(device_);
    const Deadline deadline(options_.timeout_seconds);
    ncclConfig_t config = non_blocking_config(options_);
    ncclComm_t child = nullptr;
    ncclResult_t result = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    // The split runs as a job of the parent; NCCL writes `child` when the job ends.
    // NCCL 2.28 may return ncclSuccess while the split job still runs (the parent then
    // refuses other calls until it ends), and writes `child` only at the job's end: wait on
    // the parent whatever the call returned, then for `child` itself.
    if (result == ncclSuccess || result == ncclInProgress) result = wait_while_in_progress(comm_, deadline);
    // `child` is written by NCCL's thread: read it through volatile so each poll reloads it.
    while (result == ncclSuccess && color >= 0 && *static_cast<volatile ncclComm_t*>(&child) == nullptr &&
           !deadline.passed()) {
      std::this_thread::sleep_for(kPollInterval);
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    if (result == ncclSuccess && child != nullptr) result = wait_while_in_progress(child, deadline);
    if (result != ncclSuccess) {
      std::ostringstream message;
      message << who() << ": split(color=" << color << ", key=" << key << ") ";
      if (result == ncclInProgress) {
        message << "did not finish within " << seconds_text(options_.timeout_seconds)
                << ": every rank of the communicator must call split";
      } else {
        message << "failed: " << describe(result, comm_);
      }
      // Aborting the parent first joins the split job, so `child` no longer changes.
      abort();
      if (child != nullptr) (void)ncclCommAbort(child);
      failure_ = message.str();
      THDCP_FAIL_AS(ErrorKind::kCommunication, failure_);
    }
    if (child == nullptr) {
      THDCP_CHECK(color < 0, who() << ": ncclCommSplit(color=" << color << ") returned no communicator");
      return nullptr;
    }
    int child_rank = -1, child_size = 0;
    const ncclResult_t rank_result = ncclCommUserRank(child, &child_rank);
    const ncclResult_t size_result = ncclCommCount(child, &child_size);
    if (rank_result != ncclSuccess || size_result != ncclSuccess) {
      (void)ncclCommAbort(child);
      THDCP_FAIL(who() << ": cannot read the rank and size of the split communicator: "
                       << describe(rank_result != ncclSuccess ? rank_result : size_result, child));
    }
    return std::make_unique<NcclCommunicator>(child, child_rank, child_size, device_, options_);
  }

  bool wants_windows() const override { return options_.copy_engine; }

  std::unique_ptr<Window> register_window(void* data, size_t bytes) override;

  // The communicator, or nullptr once an earlier failure aborted it (windows check it before
  // deregistering).
  ncclComm_t handle() const { return comm_; }

  void warm_up(cudaStream_t stream) override {
    check_usable("warm_up");
    CurrentDevice current(device_);
    // Block 0 holds one rank's share, blocks 1..size everybody's: no call reads what it writes.
    auto* own = static_cast<unsigned char*>(warm_up_buffer_);
    unsigned char* everyone = own + kWarmUpBytesPerRank;
    const size_t floats = kWarmUpBytesPerRank / sizeof(float);
    all_gather(own, everyone, kWarmUpBytesPerRank, stream);
    reduce_scatter_sum(reinterpret_cast<const float*>(everyone), reinterpret_cast<float*>(own), floats, stream);
    all_reduce_max(reinterpret_cast<float*>(own), floats, stream);
    // The peer-to-peer connections of all_to_all: one byte to and from every peer.
    all_to_all(everyone, own, 1, stream);
    synchronize(stream, options_.timeout_seconds);
  }

  void synchronize(cudaStream_t stream, double timeout_seconds) override {
    check_usable("synchronize");
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    THDCP_CHECK_CUDA(cudaStreamIsCapturing(stream, &capture));
    THDCP_CHECK(capture == cudaStreamCaptureStatusNone,
                who() << ": synchronize on a stream that is being captured; wait after cudaStreamEndCapture and "
                         "the graph's launch instead");
    const Deadline deadline(timeout_seconds);
    for (;;) {
      const cudaError_t status = cudaStreamQuery(stream);
      if (status != cudaSuccess && status != cudaErrorNotReady) {
        (void)cudaGetLastError();
        abort_and_throw(who() + ": the stream failed while waiting for it: " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ")");
      }
      // Checked even when the stream is done: an aborted peer ends NCCL's kernels early,
      // and then the stream completes with outputs that were never written.
      check_async_error();
      if (status == cudaSuccess) return;
      if (deadline.passed()) {
        abort_and_throw(who() + ": timed out after " + seconds_text(timeout_seconds) +
                        " waiting for the stream: a peer died or called a different collective");
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }

 private:
  // NCCL before 2.29.7 hands a copy-engine collective to cudaMemcpyBatchAsync, which refuses
  // the legacy default stream (PyTorch's default stream) with cudaErrorInvalidValue. On a
  // copy-engine communicator, an all_gather or all_to_all called on that stream runs on the
  // communicator's own stream instead, after the caller's work before it and before the
  // caller's work after it (two event edges, no host wait). The legacy stream cannot be
  // captured, so this path is never inside a graph; every other stream is used as given.
  cudaStream_t enter_copy_stream(cudaStream_t stream) {
    if (copy_stream_ == nullptr || (stream != nullptr && stream != cudaStreamLegacy)) return stream;
    THDCP_CHECK_CUDA(cudaEventRecord(copy_before_, stream));
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(copy_stream_, copy_before_, 0));
    return copy_stream_;
  }

  // After the collective was issued on `used` (enter_copy_stream's): `stream` waits for it.
  void leave_copy_stream(cudaStream_t stream, cudaStream_t used) {
    if (used == stream) return;
    THDCP_CHECK_CUDA(cudaEventRecord(copy_after_, used));
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, copy_after_, 0));
  }

  cudaError_t make_copy_stream() {
    cudaError_t status = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking);
    if (status == cudaSuccess) status = cudaEventCreateWithFlags(&copy_before_, cudaEventDisableTiming);
    if (status == cudaSuccess) status = cudaEventCreateWithFlags(&copy_after_, cudaEventDisableTiming);
    return status;
  }

  void destroy_copy_stream() noexcept {
    if (copy_after_ != nullptr) (void)cudaEventDestroy(copy_after_);
    if (copy_before_ != nullptr) (void)cudaEventDestroy(copy_before_);
    if (copy_stream_ != nullptr) (void)cudaStreamDestroy(copy_stream_);
    copy_stream_ = nullptr;
    copy_before_ = copy_after_ = nullptr;
  }

  std::string who() const {
    std::ostringstream out;
    out << "nccl rank " << rank_ << " (device " << device_ << ")";
    return out.str();
  }

  void check_usable(const char* call) const {
    if (comm_ != nullptr) return;
    THDCP_FAIL_AS(ErrorKind::kCommunication, who() << ": " << call << " on a communicator that an earlier failure "
                                                      "aborted ("
                                                   << failure_ << "); create a new communicator");
  }

  // A collective runs on the current device; one enqueued from another device's context
  // would fail inside NCCL with a less helpful message. cudaGetDevice is capture-safe.
  void check_current_device(const char* call) const {
    int current = -1;
    THDCP_CHECK_CUDA(cudaGetDevice(&current));
    THDCP_CHECK(current == device_, who() << ": " << call << " called with device " << current
                                          << " current, but the communicator's device is " << device_
                                          << "; call cudaSetDevice(" << device_ << ") on this thread first");
  }

  // Completes a collective call, which NCCL may still be issuing (making connections) on
  // its threads; a failure aborts the communicator, because the group is out of step.
  void finish(const char* call, ncclResult_t result) {
    if (result == ncclInProgress) result = wait_while_in_progress(comm_, Deadline(options_.timeout_seconds));
    if (result == ncclSuccess) return;
    if (result == ncclInProgress) {
      abort_and_throw(who() + ": " + call + " was still being issued after " + seconds_text(options_.timeout_seconds) +
                      ": a peer died or called a different collective");
    }
    abort_and_throw(who() + ": " + call + " failed: " + describe(result, comm_));
  }

  void check_async_error() {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state != ncclSuccess && state != ncclInProgress) abort_and_throw(who() + ": " + describe(state, comm_));
  }

  // Stops NCCL's kernels and threads of this rank; every later call throws `message`.
  [[noreturn]] void abort_and_throw(const std::string& message) {
    abort();
    failure_ = message;
    THDCP_FAIL_AS(ErrorKind::kCommunication, message);
  }

  // A borrowed communicator is only dropped: aborting it is its owner's decision.
  void abort() noexcept {
    if (comm_ != nullptr && owned_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Finalize (flush this rank's work, non-blocking, so a stuck peer costs the timeout, not
  // a hang) then destroy; abort when the communicator has failed or finalize does not end.
  void release() noexcept {
    ncclResult_t state = ncclInternalError;
    bool healthy = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
    if (healthy) {
      ncclResult_t result = ncclCommFinalize(comm_);
      if (result == ncclInProgress) result = wait_while_in_progress(comm_, Deadline(options_.timeout_seconds));
      healthy = result == ncclSuccess;
      if (!healthy) {
        // A destructor cannot throw; say why this rank's peers may see an aborted peer.
        const std::string reason = result == ncclInProgress
                                       ? "did not finish within " + seconds_text(options_.timeout_seconds)
                                       : "failed: " + describe(result, comm_);
        std::fprintf(stderr, "thdcp: %s: finalize %s; aborting the communicator\n", who().c_str(), reason.c_str());
      }
    }
    if (healthy) {
      (void)ncclCommDestroy(comm_);
      comm_ = nullptr;
    } else {
      abort();
    }
  }

  ncclComm_t comm_;
  int rank_;
  int size_;
  int device_;
  Options options_;
  bool owned_ = true;
  void* warm_up_buffer_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // copy_engine only: see enter_copy_stream
  cudaEvent_t copy_before_ = nullptr;
  cudaEvent_t copy_after_ = nullptr;
  std::string failure_;  // why an earlier call aborted the communicator
};

// A registered window of `owner`; deregistered (and waited for) when destroyed, on its
// device, unless a failure has aborted the communicator meanwhile.
class NcclWindow final : public DeviceCommunicator::Window {
 public:
#if THDCP_NCCL_COPY_ENGINE
  NcclWindow(const NcclCommunicator& owner, ncclWindow_t window, int device, double timeout_seconds)
      : owner_(owner), window_(window), device_(device), timeout_seconds_(timeout_seconds) {}
  ~NcclWindow() override {
    ncclComm_t comm = owner_.handle();
    if (comm == nullptr) return;
    int previous = -1;
    const bool restore = cudaGetDevice(&previous) == cudaSuccess;
    (void)cudaSetDevice(device_);
    if (ncclCommWindowDeregister(comm, window_) == ncclInProgress) {
      (void)wait_while_in_progress(comm, Deadline(timeout_seconds_));
    }
    if (restore) (void)cudaSetDevice(previous);
  }
  NcclWindow(const NcclWindow&) = delete;
  NcclWindow& operator=(const NcclWindow&) = delete;

 private:
  const NcclCommunicator& owner_;
  ncclWindow_t window_;
  int device_;
  double timeout_seconds_;
#endif
};

std::unique_ptr<DeviceCommunicator::Window> NcclCommunicator::register_window(void* data, size_t bytes) {
  check_usable("register_window");
#if THDCP_NCCL_COPY_ENGINE
  CurrentDevice current(device_);
  ncclWindow_t window = nullptr;
  try {
    // On a non-blocking communicator the registration is a group job that may still be
    // running when the call returns ncclSuccess (NCCL passes its group's ncclInProgress
    // through as success): wait for it either way, before `window` is read or the
    // communicator is used again.
    ncclResult_t result = ncclCommWindowRegister(comm_, data, bytes, &window, NCCL_WIN_COLL_SYMMETRIC);
    if (result == ncclSuccess) result = ncclInProgress;
    finish("ncclCommWindowRegister", result);
  } catch (const Error& e) {
    THDCP_FAIL_AS(ErrorKind::kCommunication,
                  e.what() << " (a window's memory must come from nccl::window_memory, the same bytes on every "
                              "rank, registered by every rank together)");
  }
  // NCCL registers nothing (and says success) where the communicator has no symmetric
  // memory support; the copy-engine collectives then cannot run.
  if (window == nullptr) {
    THDCP_FAIL_AS(ErrorKind::kUnsupported,
                  who() << ": ncclCommWindowRegister registered no window: NCCL has no symmetric memory support on "
                           "this communicator (run with NCCL_DEBUG=INFO for why); leave copy_engine off");
  }
  return std::make_unique<NcclWindow>(*this, window, device_, options_.timeout_seconds);
#else
  (void)data;
  (void)bytes;
  THDCP_FAIL_AS(ErrorKind::kUnsupported, who() << ": register_window needs NCCL 2.28.3 or later");
#endif
}

// Why this process cannot use `device`; empty when it can (and then it is current).
std::string device_problem(int device) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  std::ostringstream problem;
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    problem << "cudaGetDeviceCount failed: " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status)
            << "); this process cannot use a GPU";
  } else if (device < 0 || device >= count) {
    problem << "device " << device << " is not a CUDA device of this process (" << count
            << " visible); pass a device in [0, " << count << ")";
  } else if ((status = cudaSetDevice(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    problem << "cudaSetDevice(" << device << ") failed: " << cudaGetErrorName(status) << " ("
            << cudaGetErrorString(status) << ")";
  }
  return problem.str();
}

// What each rank contributes to the bootstrap all_gather: whether it can join, and from
// rank 0 the unique id. Plain bytes, so any host communicator can carry it.
struct JoinRecord {
  int ready;
  int device;
  char problem[384];
  ncclUniqueId id;
};

// ncclCommInitRankConfig (non-blocking) of `rank` of `size` on `device`, which is current.
std::unique_ptr<DeviceCommunicator> init_rank(const ncclUniqueId& id, int rank, int size, int device,
                                              const Options& options) {
  ncclConfig_t config = non_blocking_config(options);
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (result == ncclInProgress && comm != nullptr) {
    result = wait_while_in_progress(comm, Deadline(options.timeout_seconds));
  }
  if (result != ncclSuccess || comm == nullptr) {
    std::ostringstream message;
    message << "nccl::create: rank " << rank << " of " << size << " (device " << device << "): ncclCommInitRankConfig ";
    if (result == ncclInProgress) {
      message << "did not finish within " << seconds_text(options.timeout_seconds)
              << ": a rank did not call create, or cannot reach rank 0 (run with NCCL_DEBUG=WARN to see which)";
    } else {
      message << "failed: " << describe(result, comm);
    }
    if (comm != nullptr) (void)ncclCommAbort(comm);
    THDCP_FAIL_AS(ErrorKind::kCommunication, message.str());
  }
  return std::make_unique<NcclCommunicator>(comm, rank, size, device, options);
}

}  // namespace

bool built_with_nccl() { return true; }

std::shared_ptr<void> window_memory(size_t bytes) {
  void* data = nullptr;
  const ncclResult_t result = ncclMemAlloc(&data, std::max<size_t>(bytes, 1));
  THDCP_CHECK(result == ncclSuccess && data != nullptr,
              "nccl::window_memory(" << bytes << "): ncclMemAlloc failed: " << describe(result, nullptr)
                                     << "; free device memory, or check that the driver supports CUDA virtual "
                                        "memory");
  return std::shared_ptr<void>(data, [](void* p) { (void)ncclMemFree(p); });
}

std::unique_ptr<DeviceCommunicator> create(Communicator& bootstrap, int device, const Options& options) {
  const int rank = bootstrap.rank();
  const int size = bootstrap.size();

  JoinRecord mine;
  std::memset(&mine, 0, sizeof(mine));
  mine.device = device;
  std::string problem = device_problem(device);
  if (problem.empty() && rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&mine.id);
    if (result != ncclSuccess) problem = "ncclGetUniqueId failed: " + describe(result, nullptr);
  }
  mine.ready = problem.empty() ? 1 : 0;
  std::snprintf(mine.problem, sizeof(mine.problem), "%s", problem.c_str());

  std::vector<JoinRecord> records(static_cast<size_t>(size));
  bootstrap.all_gather(&mine, records.data(), sizeof(JoinRecord));
  // Every rank throws when any rank cannot join, so that none waits in NCCL's init for a
  // rank that never comes.
  std::ostringstream failures;
  for (int r = 0; r < size; ++r) {
    const JoinRecord& record = records[static_cast<size_t>(r)];
    if (record.ready) continue;
    failures << (failures.tellp() > 0 ? "; " : "") << "rank " << r << " (device " << record.device
             << "): " << record.problem;
  }
  THDCP_CHECK(failures.tellp() == 0, "nccl::create on " << size << " ranks: " << failures.str());

  return init_rank(records[0].id, rank, size, device, options);
}

std::vector<char> unique_id() {
  static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "kUniqueIdBytes must be NCCL's unique id size");
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  THDCP_CHECK(result == ncclSuccess, "nccl::unique_id: ncclGetUniqueId failed: " << describe(result, nullptr));
  const char* bytes = reinterpret_cast<const char*>(&id);
  return std::vector<char>(bytes, bytes + sizeof(id));
}

std::unique_ptr<DeviceCommunicator> create_from_unique_id(const void* id, size_t id_bytes, int rank, int size,
                                                          int device, const Options& options) {
  THDCP_CHECK(id != nullptr, "nccl::create_from_unique_id: id is null; pass the " << kUniqueIdBytes
                                                                                   << " bytes of nccl::unique_id() made on one rank");
  THDCP_CHECK(id_bytes == kUniqueIdBytes, "nccl::create_from_unique_id: id_bytes = "
                                              << id_bytes << "; NCCL's unique id has " << kUniqueIdBytes << " bytes");
  THDCP_CHECK(size >= 1, "nccl::create_from_unique_id: size = " << size << "; a communicator has at least one rank");
  THDCP_CHECK(rank >= 0 && rank < size,
              "nccl::create_from_unique_id: rank = " << rank << " with size " << size << "; pass a rank in [0, " << size << ")");
  const std::string problem = device_problem(device);
  THDCP_CHECK(problem.empty(), "nccl::create_from_unique_id: rank " << rank << ": " << problem);
  ncclUniqueId unique;
  std::memcpy(&unique, id, sizeof(unique));
  return init_rank(unique, rank, size, device, options);
}

std::unique_ptr<DeviceCommunicator> borrow(void* nccl_comm, int device, const Options& options) {
  THDCP_CHECK(nccl_comm != nullptr, "nccl::borrow: nccl_comm is null; pass an initialised ncclComm_t");
  const std::string problem = device_problem(device);
  THDCP_CHECK(problem.empty(), "nccl::borrow: " << problem);
  auto comm = static_cast<ncclComm_t>(nccl_comm);
  int comm_device = -1, rank = -1, size = 0;
  ncclResult_t result = ncclCommCuDevice(comm, &comm_device);
  if (result == ncclSuccess) result = ncclCommUserRank(comm, &rank);
  if (result == ncclSuccess) result = ncclCommCount(comm, &size);
  THDCP_CHECK(result == ncclSuccess, "nccl::borrow: cannot read the communicator's device, rank and size: "
                                         << describe(result, comm) << "; pass an initialised ncclComm_t");
  THDCP_CHECK(comm_device == device, "nccl::borrow: device = " << device << " but the communicator's device is "
                                                               << comm_device << "; pass " << comm_device);
  return std::make_unique<NcclCommunicator>(comm, rank, size, device, options, /*owned=*/false);
}

}  // namespace thdcp::nccl
