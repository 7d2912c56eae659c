#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "thdcp/comm/communicator.h"

#include "block_sizes.h"
#include "thdcp/comm/rank_threads.h"
#include "thdcp/comm/thread_barrier.h"
#include "thdcp/core/error.h"

namespace thdcp {

// State shared by the ranks of one in-process group. Collectives follow one pattern:
// every rank publishes its pointers, a barrier, every rank reads what it needs from the
// others, a second barrier so nobody returns (and frees its buffers) while being read.
struct InProcessGroup::State {
  explicit State(int size) : size_(size), sends_(size), recvs_(size), send_bytes_(size), recv_bytes_(size) {}

  int size() const { return size_; }

  // `send_bytes` and `recv_bytes`: the block sizes of all_to_all_v (size() entries each).
  void publish(int rank, const void* send, void* recv, const size_t* send_bytes = nullptr,
               const size_t* recv_bytes = nullptr) {
    sends_[rank] = send;
    recvs_[rank] = recv;
    send_bytes_[rank] = send_bytes;
    recv_bytes_[rank] = recv_bytes;
  }
  const void* send_of(int rank) const { return sends_[rank]; }
  const size_t* send_bytes_of(int rank) const { return send_bytes_[rank]; }

  // The first pair of ranks whose all_to_all_v block sizes disagree ("" when none).
  std::string block_size_mismatch() const {
    return detail::block_size_mismatch(
        size_, [&](int from, int to) { return send_bytes_[from][to]; },
        [&](int to, int from) { return recv_bytes_[to][from]; });
  }

  void barrier() {
    if (!barrier_.wait()) throw abandoned();
  }

  // Releases this group and every group split from it (their collectives throw too).
  void abort(const std::string& reason = {}) {
    std::vector<std::shared_ptr<State>> children;
    std::string first_reason;
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      if (!barrier_.aborted()) reason_ = reason;
      barrier_.abort();
      for (const auto& child : children_) {
        if (auto alive = child.lock()) children.push_back(std::move(alive));
      }
      first_reason = reason_;
    }
    for (const auto& child : children) child->abort(first_reason);
  }

  // A group split from this one: aborted with it (at once if this one already is).
  void adopt(const std::shared_ptr<State>& child) {
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      if (!barrier_.aborted()) {
        children_.push_back(child);
        return;
      }
    }
    child->abort(reason_);
  }

 private:
  // run_in_process looks for "another rank failed" to tell these from the exception that
  // caused the abort.
  Error abandoned() const {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    std::string message = "in-process communicator: another rank failed, collective abandoned";
    if (!reason_.empty()) message += " (" + reason_ + ")";
    return Error(message, ErrorKind::kCommunication);
  }

  int size_;
  std::vector<const void*> sends_;
  std::vector<void*> recvs_;
  std::vector<const size_t*> send_bytes_, recv_bytes_;
  ThreadBarrier barrier_{size_};
  mutable std::mutex reason_mutex_;
  std::string reason_;  // the first abort's reason
  std::vector<std::weak_ptr<State>> children_;  // groups split from this one
};

namespace {

using GroupState = InProcessGroup::State;

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(GroupState& group, int rank, std::shared_ptr<GroupState> keep = nullptr)
      : group_(group), rank_(rank), keep_(std::move(keep)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  const char* kind() const override { return "in-process"; }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    group_.publish(rank_, send, recv);
    group_.barrier();
    // Zero bytes on one rank is zero on all (equal sizes are the caller's contract); an empty
    // tensor's data may then be null, which memcpy may not be given even for no bytes.
    for (int r = 0; r < size() && bytes > 0; ++r) {
      std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, group_.send_of(r), bytes);
    }
    group_.barrier();
  }

  void reduce_scatter_sum(const float* send, float* recv, size_t count) override {
    group_.publish(rank_, send, recv);
    group_.barrier();
    const size_t offset = static_cast<size_t>(rank_) * count;
    for (size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (int r = 0; r < size(); ++r) sum += static_cast<const float*>(group_.send_of(r))[offset + i];
      recv[i] = sum;
    }
    group_.barrier();
  }

  void all_reduce_max(float* data, size_t count) override {
    // Reduce into a private copy first: `data` is both this rank's input and output.
    std::vector<float> result(data, data + count);
    group_.publish(rank_, data, data);
    group_.barrier();
    for (int r = 0; r < size(); ++r) {
      const float* other = static_cast<const float*>(group_.send_of(r));
      for (size_t i = 0; i < count; ++i) result[i] = other[i] > result[i] ? other[i] : result[i];
    }
    group_.barrier();
    if (count > 0) std::memcpy(data, result.data(), count * sizeof(float));
  }

  void all_to_all(const void* send, void* recv, size_t bytes) override {
    group_.publish(rank_, send, recv);
    group_.barrier();
    const size_t offset = static_cast<size_t>(rank_) * bytes;
    for (int r = 0; r < size() && bytes > 0; ++r) {  // no bytes: possibly null data (all_gather's note)
      std::memcpy(static_cast<unsigned char*>(recv) + r * bytes,
                  static_cast<const unsigned char*>(group_.send_of(r)) + offset, bytes);
    }
    group_.barrier();
  }

  void all_to_all_v(const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes) override {
    group_.publish(rank_, send, recv, send_bytes, recv_bytes);
    group_.barrier();
    // Checked by every rank, thrown only after the second barrier: no rank leaves (and frees
    // its buffers) while another may still read them.
    const std::string mismatch = group_.block_size_mismatch();
    if (mismatch.empty()) {
      auto* to = static_cast<unsigned char*>(recv);
      for (int from = 0; from < size(); ++from) {
        const size_t* theirs = group_.send_bytes_of(from);
        size_t offset = 0;
        for (int r = 0; r < rank_; ++r) offset += theirs[r];
        const size_t bytes = recv_bytes[from];
        if (bytes > 0) std::memcpy(to, static_cast<const unsigned char*>(group_.send_of(from)) + offset, bytes);
        to += bytes;
      }
    }
    group_.barrier();
    THDCP_CHECK(mismatch.empty(), mismatch);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * static_cast<size_t>(size()));
    all_gather(mine, all.data(), sizeof(mine));
    std::vector<std::pair<int32_t, int>> members;  // (key, rank) of this color, in sub-group order
    for (int r = 0; color >= 0 && r < size(); ++r) {
      if (all[2 * static_cast<size_t>(r)] == color) members.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
    }
    std::sort(members.begin(), members.end());
    const int leader = members.empty() ? -1 : members.front().second;
    std::shared_ptr<GroupState> sub;
    if (leader == rank_) {
      sub = std::make_shared<GroupState>(static_cast<int>(members.size()));
      group_.adopt(sub);
    }
    // The leader of each color publishes its group's state and the other members copy it; the
    // second barrier keeps the leader (and its `sub`) here until every copy is made.
    group_.publish(rank_, &sub, nullptr);
    group_.barrier();
    if (leader >= 0 && leader != rank_) sub = *static_cast<const std::shared_ptr<GroupState>*>(group_.send_of(leader));
    group_.barrier();
    if (color < 0) return nullptr;
    const auto me = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.second == rank_; });
    return std::make_unique<InProcessCommunicator>(*sub, static_cast<int>(me - members.begin()), sub);
  }

 private:
  GroupState& group_;
  int rank_;
  std::shared_ptr<GroupState> keep_;  // the group's owner: of an InProcessGroup, or of a split
};

}  // namespace

void run_in_process(int size, const std::function<void(Communicator&)>& body) {
  THDCP_CHECK(size >= 1, "in-process group size " << size << " must be >= 1");
  GroupState group(size);
  std::vector<std::exception_ptr> failures(static_cast<size_t>(size));
  auto rank_main = [&](int rank) {
    InProcessCommunicator comm(group, rank);
    try {
      body(comm);
    } catch (...) {
      failures[static_cast<size_t>(rank)] = std::current_exception();
      group.abort();
    }
  };
  detail::run_rank_threads(size, rank_main, [&](const std::string&) { group.abort(); }, "in-process group");
  // The exception that caused the abort, not the "another rank failed" ones it set off.
  detail::rethrow_root_failure(failures, "another rank failed");
}

InProcessGroup::InProcessGroup(int size) {
  THDCP_CHECK(size >= 1, "in-process group size " << size << " must be >= 1");
  state_ = std::make_shared<State>(size);
}

int InProcessGroup::size() const { return state_->size(); }

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  THDCP_CHECK(rank >= 0 && rank < state_->size(),
              "rank=" << rank << " must be in [0, " << state_->size() << ") for an in-process group of "
                      << state_->size() << " ranks");
  return std::make_unique<InProcessCommunicator>(*state_, rank, state_);
}

void InProcessGroup::abort(const std::string& reason) { state_->abort(reason); }

}  // namespace thdcp
