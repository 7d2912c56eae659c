// MPI implementation of the communicator (built with THDCP_WITH_MPI).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "block_sizes.h"

#include "thdcp/core/error.h"
#include "thdcp/comm/mpi.h"

#define THDCP_CHECK_MPI(call)                                                  \
  do {                                                                         \
    const int thdcp_mpi_status_ = (call);                                      \
    if (thdcp_mpi_status_ != MPI_SUCCESS) {                                    \
      char thdcp_mpi_text_[MPI_MAX_ERROR_STRING];                              \
      int thdcp_mpi_len_ = 0;                                                  \
      MPI_Error_string(thdcp_mpi_status_, thdcp_mpi_text_, &thdcp_mpi_len_);   \
      THDCP_FAIL_AS(::thdcp::ErrorKind::kCommunication,                                            \
                    #call << " failed: " << std::string(thdcp_mpi_text_, thdcp_mpi_len_));      \
    }                                                                          \
  } while (0)

namespace thdcp::mpi {

namespace {

// `bytes` per rank as an MPI count and type: MPI counts are int, so buffers over 2 GiB move
// as blocks of a contiguous type.
struct Blocks {
  Blocks(const char* collective, size_t bytes) {
    if (bytes <= static_cast<size_t>(INT32_MAX)) {
      count = static_cast<int>(bytes);
      return;
    }
    THDCP_CHECK(bytes % 4096 == 0,
                collective << " of " << bytes << " bytes: buffers over 2 GiB must be a multiple of 4096 bytes");
    THDCP_CHECK_MPI(MPI_Type_contiguous(4096, MPI_BYTE, &type));
    THDCP_CHECK_MPI(MPI_Type_commit(&type));
    count = static_cast<int>(bytes / 4096);
  }
  ~Blocks() {
    if (type != MPI_BYTE) MPI_Type_free(&type);
  }
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;

  MPI_Datatype type = MPI_BYTE;
  int count = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  // `owned`: a communicator of split(), freed with this object (unless MPI is finalized).
  explicit MpiCommunicator(MPI_Comm comm, bool owned = false) : comm_(comm), owned_(owned) {
    THDCP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    THDCP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    const Blocks blocks("all_gather", bytes);
    THDCP_CHECK_MPI(MPI_Allgather(send, blocks.count, blocks.type, recv, blocks.count, blocks.type, comm_));
  }

  void all_to_all(const void* send, void* recv, size_t bytes) override {
    const Blocks blocks("all_to_all", bytes);
    THDCP_CHECK_MPI(MPI_Alltoall(send, blocks.count, blocks.type, recv, blocks.count, blocks.type, comm_));
  }

  // MPI_Reduce_scatter_block may add the blocks in any order (MPI_SUM is commutative, float
  // addition is not associative): the blocks move by an all-to-all and are added here in rank
  // order, the order the communicator promises.
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    THDCP_CHECK(count <= static_cast<size_t>(INT32_MAX), "reduce_scatter of " << count << " floats per rank exceeds MPI's int counts");
    blocks_.resize(count * static_cast<size_t>(size_));
    THDCP_CHECK_MPI(MPI_Alltoall(send, static_cast<int>(count), MPI_FLOAT, blocks_.data(), static_cast<int>(count),
                                 MPI_FLOAT, comm_));
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < size_; ++r) sum += blocks_[static_cast<size_t>(r) * count + i];
      recv[i] = sum;
    }
  }

  // Every rank's block sizes first (one all-gather), so that a mismatch throws on every rank;
  // then a receive and a send per peer, in pieces of at most 1 GiB (MPI counts are int).
  void all_to_all_v(const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes) override {
    const size_t n = static_cast<size_t>(size_);
    std::vector<uint64_t> mine(2 * n), all(2 * n * n);
    for (size_t r = 0; r < n; ++r) {
      mine[r] = send_bytes[r];
      mine[n + r] = recv_bytes[r];
    }
    THDCP_CHECK_MPI(MPI_Allgather(mine.data(), static_cast<int>(2 * n), MPI_UINT64_T, all.data(),
                                  static_cast<int>(2 * n), MPI_UINT64_T, comm_));
    const std::string mismatch = detail::block_size_mismatch(
        size_, [&](int from, int to) { return static_cast<size_t>(all[from * 2 * n + to]); },
        [&](int to, int from) { return static_cast<size_t>(all[to * 2 * n + n + from]); });
    THDCP_CHECK(mismatch.empty(), mismatch);

    constexpr size_t kPiece = size_t{1} << 30;
    const auto* from = static_cast<const unsigned char*>(send);
    auto* to = static_cast<unsigned char*>(recv);
    std::vector<MPI_Request> requests;
    for (int peer = 0; peer < size_; ++peer) {
      const size_t in = recv_bytes[peer], out = send_bytes[peer];
      if (peer == rank_) {
        if (in > 0) std::memcpy(to, from, in);
      } else {
        for (size_t done = 0; done < in; done += kPiece) {
          requests.emplace_back();
          THDCP_CHECK_MPI(MPI_Irecv(to + done, static_cast<int>(std::min(kPiece, in - done)), MPI_BYTE, peer,
                                    kAllToAllVTag, comm_, &requests.back()));
        }
        for (size_t done = 0; done < out; done += kPiece) {
          requests.emplace_back();
          THDCP_CHECK_MPI(MPI_Isend(from + done, static_cast<int>(std::min(kPiece, out - done)), MPI_BYTE, peer,
                                    kAllToAllVTag, comm_, &requests.back()));
        }
      }
      to += in;
      from += out;
    }
    THDCP_CHECK_MPI(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    THDCP_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub, /*owned=*/true);
  }

  void all_reduce_max(float* data, size_t count) override {
    THDCP_CHECK(count <= static_cast<size_t>(INT32_MAX), "all_reduce of " << count << " floats exceeds MPI's int counts");
    THDCP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_MAX, comm_));
  }

 private:
  static constexpr int kAllToAllVTag = 3101;

  MPI_Comm comm_;
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
  std::vector<float> blocks_;  // reduce_scatter_sum's received blocks
};

}  // namespace

bool built_with_mpi() { return true; }

Session::Session(int* argc, char*** argv) {
  int initialized = 0;
  THDCP_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    THDCP_CHECK_MPI(MPI_Init(argc, argv));
    owns_ = true;
  }
}

Session::~Session() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

void Session::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

std::unique_ptr<Communicator> world() {
  int initialized = 0;
  THDCP_CHECK_MPI(MPI_Initialized(&initialized));
  THDCP_CHECK(initialized, "thdcp::mpi::world() needs MPI initialised: create a thdcp::mpi::Session first");
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace thdcp::mpi
