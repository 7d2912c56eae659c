// A rank killed mid-job must not hang the others (issue 13): one process per GPU, as under
// mpirun, but started by fork() here so that the test itself outlives the killed rank (an MPI
// launcher would tear the whole job down first). Usage: test_nccl_killed_rank N.
//
// Rank 0 makes NCCL's unique id and hands it to the others through pipes; every rank makes
// its communicator with create_from_unique_id on GPU `rank`, and one all-gather proves the
// group works (its bytes are checked). Then the last rank kills itself (SIGKILL: no
// destructor, no NCCL abort, exactly what a crashed or OOM-killed rank looks like). The
// others enqueue the next all-gather and wait with synchronize(stream, 10 s): each must
// throw thdcp::Error naming its rank within the bounds the caller set (the communicator's
// Options::timeout_seconds, 30 s, bounds the issue of a collective that NCCL cannot finish
// issuing; synchronize's 10 s the wait for the stream), whichever of them fires, or NCCL's
// own report of the lost peer; and every later call must throw too. The parent waits for
// all of them with a deadline; a rank still running past it is a hang, and fails the test.
//
// Exit: 0 when every survivor threw in time, 77 (skipped) when fewer than N GPUs are
// visible, 1 otherwise. No CUDA call is made before fork().
#include <cuda_runtime_api.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/device_buffer.h"

namespace thdcp {
namespace {

constexpr int kPassed = 0;
constexpr int kFailed = 1;
constexpr int kSkipped = 77;
constexpr double kIssueSeconds = 30;  // nccl::Options::timeout_seconds
constexpr double kWaitSeconds = 10;   // what each survivor gives synchronize()
// The bound the test holds a survivor to: both timeouts, plus the abort and slack.
constexpr double kThrowWithinSeconds = kIssueSeconds + kWaitSeconds + 10;
constexpr double kDeadlineSeconds = 180;  // the parent's bound on the whole job
constexpr size_t kGatherBytes = size_t{1} << 20;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

unsigned char byte_of(int rank, size_t index) { return static_cast<unsigned char>((rank * 131 + index * 7 + 1) & 0xff); }

// Reads exactly `bytes`, waiting at most `seconds`.
bool read_exactly(int fd, void* data, size_t bytes, double seconds) {
  auto* at = static_cast<unsigned char*>(data);
  const auto start = std::chrono::steady_clock::now();
  while (bytes > 0) {
    pollfd p{fd, POLLIN, 0};
    const int left_ms = static_cast<int>((seconds - seconds_since(start)) * 1000);
    if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) return false;
    const ssize_t got = read(fd, at, bytes);
    if (got <= 0) return false;
    at += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

// One all-gather of kGatherBytes per rank, waited for and checked byte by byte.
bool gather_and_check(DeviceCommunicator& comm, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<unsigned char> send(kGatherBytes), recv(kGatherBytes * n);
  for (size_t i = 0; i < kGatherBytes; ++i) send[i] = byte_of(comm.rank(), i);
  cuda::DeviceBuffer d_send(kGatherBytes), d_recv(kGatherBytes * n);
  THDCP_CHECK_CUDA(cudaMemcpy(d_send.data(), send.data(), kGatherBytes, cudaMemcpyHostToDevice));
  comm.all_gather(d_send.data(), d_recv.data(), kGatherBytes, stream);
  comm.synchronize(stream, 60);
  THDCP_CHECK_CUDA(cudaMemcpy(recv.data(), d_recv.data(), recv.size(), cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < kGatherBytes; ++i) {
      if (recv[r * kGatherBytes + i] != byte_of(static_cast<int>(r), i)) {
        std::fprintf(stderr, "rank %d: gathered byte %zu of rank %zu is %d, expected %d\n", comm.rank(), i, r,
                     recv[r * kGatherBytes + i], byte_of(static_cast<int>(r), i));
        return false;
      }
    }
  }
  return true;
}

// The body of rank `rank`'s process; returns its exit code. `to_peers[r]` is the write end of
// rank r's id pipe (rank 0 writes them), `from_root` this rank's read end.
int rank_main(int rank, int size, const std::vector<int>& to_peers, int from_root) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (gpus < size) {
    if (rank == 0) std::printf("test_nccl_killed_rank: SKIPPED: needs %d GPUs, %d visible\n", size, gpus);
    return kSkipped;  // rank 0 writes no id, so the others time out reading it and skip too
  }
  std::vector<char> id(nccl::kUniqueIdBytes);
  if (rank == 0) {
    id = nccl::unique_id();
    for (int r = 1; r < size; ++r) {
      if (write(to_peers[static_cast<size_t>(r)], id.data(), id.size()) != static_cast<ssize_t>(id.size())) {
        std::fprintf(stderr, "rank 0: could not send the unique id to rank %d\n", r);
        return kFailed;
      }
    }
  } else if (!read_exactly(from_root, id.data(), id.size(), 60)) {
    std::fprintf(stderr, "rank %d: no unique id from rank 0 within 60 s\n", rank);
    return kFailed;
  }

  nccl::Options options;
  options.timeout_seconds = kIssueSeconds;
  std::unique_ptr<DeviceCommunicator> comm = nccl::create_from_unique_id(id.data(), id.size(), rank, size, rank, options);
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (!gather_and_check(*comm, stream)) return kFailed;

  if (rank == size - 1) {
    std::printf("rank %d: the group works; killing this process (SIGKILL)\n", rank);
    std::fflush(stdout);
    raise(SIGKILL);
  }

  // Survivors: the next collective can never finish.
  cuda::DeviceBuffer send(kGatherBytes), recv(kGatherBytes * static_cast<size_t>(size));
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    comm->all_gather(send.data(), recv.data(), kGatherBytes, stream);
    comm->synchronize(stream, kWaitSeconds);
  } catch (const Error& e) {
    message = e.what();
  }
  const double waited = seconds_since(start);
  int code = kPassed;
  const std::string names_rank = "nccl rank " + std::to_string(rank);
  if (message.empty()) {
    std::fprintf(stderr, "rank %d: the all-gather with a killed peer returned without an error after %.1f s\n", rank,
                 waited);
    code = kFailed;
  } else if (message.find(names_rank) == std::string::npos) {
    std::fprintf(stderr, "rank %d: the error does not name '%s': %s\n", rank, names_rank.c_str(), message.c_str());
    code = kFailed;
  } else if (waited > kThrowWithinSeconds) {
    std::fprintf(stderr, "rank %d: threw after %.1f s, more than %.0f s\n", rank, waited, kThrowWithinSeconds);
    code = kFailed;
  } else {
    std::printf("rank %d: threw after %.1f s: %s\n", rank, waited, message.c_str());
  }
  // The communicator is aborted: a later call refuses at once.
  bool refused = false;
  try {
    comm->all_gather(send.data(), recv.data(), kGatherBytes, stream);
  } catch (const Error&) {
    refused = true;
  }
  if (!refused) {
    std::fprintf(stderr, "rank %d: a call after the failure was accepted\n", rank);
    code = kFailed;
  }
  const auto destroy = std::chrono::steady_clock::now();
  comm.reset();  // bounded: the communicator was aborted
  (void)cudaStreamDestroy(stream);
  std::printf("rank %d: destroyed the communicator in %.1f s\n", rank, seconds_since(destroy));
  std::fflush(stdout);
  return code;
}

int parent_main(int size) {
  std::vector<int> read_ends(static_cast<size_t>(size), -1), write_ends(static_cast<size_t>(size), -1);
  for (int r = 1; r < size; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      return kFailed;
    }
    read_ends[static_cast<size_t>(r)] = fds[0];
    write_ends[static_cast<size_t>(r)] = fds[1];
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return kFailed;
    }
    if (pid == 0) {
      int code = kFailed;
      try {
        code = rank_main(r, size, write_ends, read_ends[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);  // the child's end; the parent's own exit path runs only in the parent
    }
    pids.push_back(pid);
  }
  for (int fd : read_ends) if (fd >= 0) close(fd);
  for (int fd : write_ends) if (fd >= 0) close(fd);

  const auto start = std::chrono::steady_clock::now();
  std::vector<int> status(static_cast<size_t>(size), 0);
  std::vector<bool> done(static_cast<size_t>(size), false);
  int remaining = size;
  while (remaining > 0 && seconds_since(start) < kDeadlineSeconds) {
    for (int r = 0; r < size; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      if (waitpid(pids[static_cast<size_t>(r)], &status[static_cast<size_t>(r)], WNOHANG) > 0) {
        done[static_cast<size_t>(r)] = true;
        --remaining;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (remaining > 0) {
    for (int r = 0; r < size; ++r) {
      if (!done[static_cast<size_t>(r)]) {
        std::fprintf(stderr, "rank %d still running after %.0f s: a hang; killing it\n", r, kDeadlineSeconds);
        kill(pids[static_cast<size_t>(r)], SIGKILL);
        waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
      }
    }
    return kFailed;
  }
  const auto exit_code = [&](int r) {
    const int s = status[static_cast<size_t>(r)];
    return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  };
  if (exit_code(0) == kSkipped) return kSkipped;
  int code = kPassed;
  for (int r = 0; r < size; ++r) {
    const int s = status[static_cast<size_t>(r)];
    if (r == size - 1) {
      if (!(WIFSIGNALED(s) && WTERMSIG(s) == SIGKILL)) {
        std::fprintf(stderr, "rank %d (the one to kill) ended otherwise: exit %d\n", r, exit_code(r));
        code = kFailed;
      }
    } else if (exit_code(r) != kPassed) {
      std::fprintf(stderr, "rank %d failed (exit %d, signal %d)\n", r, exit_code(r),
                   WIFSIGNALED(s) ? WTERMSIG(s) : 0);
      code = kFailed;
    }
  }
  std::printf("test_nccl_killed_rank %d: %s after %.1f s\n", size, code == kPassed ? "PASSED" : "FAILED",
              seconds_since(start));
  return code;
}

}  // namespace
}  // namespace thdcp

int main(int argc, char** argv) {
  const int size = argc > 1 ? std::atoi(argv[1]) : 2;
  if (size < 2 || size > 64) {
    std::fprintf(stderr, "usage: test_nccl_killed_rank N (2 <= N <= 64 processes, one per GPU)\n");
    return 2;
  }
  if (!thdcp::nccl::built_with_nccl()) {
    std::printf("test_nccl_killed_rank: SKIPPED: thdcp was built without NCCL\n");
    return thdcp::kSkipped;
  }
  return thdcp::parent_main(size);
}
