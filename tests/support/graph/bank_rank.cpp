#include "support/graph/bank_rank.h"

#include <algorithm>

namespace thdcp::test {

BankRank::BankRank(DeviceCommunicator& comm, GraphBank& bank, int64_t max_tokens, const Shape& s,
                   const CpMode& mode, graph::WorkspaceArena* arena)
    : comm_(comm),
      bank_(bank),
      s_(s),
      mode_(mode),
      arena_(arena),
      tensors_(s.dtype, max_tokens / comm.size(), max_tokens / comm.size(), s.heads(), s.dtype) {
  if (arena_) {
    for (const Capacity& c : bank.run_capacities()) arena_->reserve(cp::cuda_workspace_size(problem_at(c)));
  }
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

BankRank::~BankRank() {
  plans_.clear();
  eager_.clear();
  cudaStreamDestroy(stream_);
}

graph::Work BankRank::work() {
  return [this](const StaticBatch& b, cudaStream_t stream) {
    cp::CudaPlan& p = plan(b.capacity());
    const int64_t rows = b.capacity().max_tokens / comm_.size();
    p.forward(b.layout(), tensors_.forward_tensors(rows), stream);
    p.backward(b.layout(), tensors_.backward_tensors(rows), stream);
  };
}

void BankRank::load(const Batch& b) {
  const LayoutView layout = b.layout.view();
  const int cp = comm_.size(), rank = comm_.rank();
  const int64_t rows = b.layout.total_rows() / cp;
  const auto upload = [&](DeviceTensor& t, const HostTensor& global) {
    const HostTensor part = local_part(global, layout, cp, rank, bank_.cp_layout());
    t.buffer.upload(part.data(), static_cast<size_t>(rows) * part.row_bytes(), stream_);
  };
  upload(tensors_.q, b.q);
  upload(tensors_.k, b.k);
  upload(tensors_.v, b.v);
  upload(tensors_.dout, b.dout);
  tensors_.poison_outputs(stream_);
}

Outputs BankRank::banked(GraphBank& bank, const Batch& b, const std::vector<int64_t>& lengths,
                         GraphBank::Outcome* outcome) {
  load(b);
  const GraphBank::Outcome o = bank.run(lengths, work(), stream_);
  if (outcome != nullptr) *outcome = o;
  return download(o.capacity.max_tokens / comm_.size());
}

Outputs BankRank::eager(const Batch& b, const std::vector<int64_t>& lengths, const Capacity& capacity) {
  load(b);
  run_eager(lengths, capacity);
  return download(capacity.max_tokens / comm_.size());
}

void BankRank::run_eager(const std::vector<int64_t>& lengths, const Capacity& capacity) {
  auto it = eager_.find(capacity);
  if (it == eager_.end()) {
    it = eager_.emplace(capacity, std::make_unique<StaticBatch>(comm_.size(), capacity, bank_.cp_layout())).first;
  }
  ASSERT_EQ(it->second->fill(lengths, stream_), Fit::kFits);
  work()(*it->second, stream_);
}

Outputs BankRank::download(int64_t rows) {
  // The rank's stream follows its group's replay. No device-wide sync: another group may be
  // capturing meanwhile.
  comm_.synchronize(stream_, 120);
  return tensors_.download_outputs(rows);
}

cp::Problem BankRank::problem_at(const Capacity& c) const {
  cp::Problem problem = cp_problem(comm_.size(), c, s_);
  problem.layout = bank_.cp_layout();
  problem.comm = mode_.comm;
  problem.a2a_size = mode_.a2a_size;
  return problem;
}

cp::CudaPlan& BankRank::plan(const Capacity& c) {
  auto it = plans_.find(c);
  if (it != plans_.end()) return *it->second;
  const cp::Problem problem = problem_at(c);
  const size_t bytes = cp::cuda_workspace_size(problem);
  void* workspace = arena_ ? arena_->take(bytes) : bank_.buffer(c, "cp workspace", bytes);
  auto plan = std::make_unique<cp::CudaPlan>(comm_, problem, AttentionOptions{}, workspace, bytes);
  return *plans_.emplace(c, std::move(plan)).first->second;
}

DynamicCpRank::DynamicCpRank(DeviceCommunicator& world, const std::vector<int>& sizes, int64_t max_tokens,
                             const Shape& s)
    : max_tokens_(max_tokens) {
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&setup_, cudaStreamNonBlocking));
  graph::BankOptions options;
  options.capture_mode = cudaStreamCaptureModeThreadLocal;  // the groups capture side by side
  groups_ = std::make_unique<graph::CpGroups>(world, sizes, setup_, options);
  for (int c : groups_->sizes()) {
    if (!groups_->has_group(c)) continue;  // the world's last ranks when c does not divide it
    groups_->bank(c).add_capacity(default_capacity(max_tokens, c));
    ranks_[c] = std::make_unique<BankRank>(groups_->group(c), groups_->bank(c), max_tokens, s, CpMode{},
                                           &groups_->arena());
  }
}

DynamicCpRank::~DynamicCpRank() {
  ranks_.clear();
  EXPECT_EQ(cudaStreamDestroy(setup_), cudaSuccess);
}

Outputs DynamicCpRank::banked(int c, const Batch& b, const std::vector<int64_t>& lengths,
                              GraphBank::Outcome* outcome) {
  return ranks_.at(c)->banked(groups_->bank(c), b, lengths, outcome);
}

Outputs DynamicCpRank::eager(int c, const Batch& b, const std::vector<int64_t>& lengths) {
  return ranks_.at(c)->eager(b, lengths, default_capacity(max_tokens_, c));
}

size_t DynamicCpRank::workspace_bytes(int c) const {
  return cp::cuda_workspace_size(ranks_.at(c)->problem_at(default_capacity(max_tokens_, c)));
}

void GraphNcclTest::SetUp() {
  CudaTest::SetUp();
  if (IsSkipped()) return;
  if (!nccl::built_with_nccl()) GTEST_SKIP() << "thdcp was built without NCCL";
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&gpus_));
}

Batch batch_of(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity, const Shape& s, uint64_t seed,
               CpLayout layout) {
  return make_batch(capacity_layout(lengths, cp, capacity, layout), s, seed);
}

std::vector<std::vector<int64_t>> packings(int cp, const Capacity& c, uint64_t seed, CpLayout layout) {
  std::vector<std::vector<int64_t>> out;
  out.push_back({c.max_tokens});
  // Every document slot used: 2*cp rows each under the dual-chunk layout (its least padded
  // length); under the contiguous one (max_seqs = max_tokens + 1) documents of 2 and 0 rows in
  // turn, within max_tokens. Not all of one row: those give dq = dk = 0 exactly, and a zero
  // reference leaves the tolerance no scale.
  std::vector<int64_t> every_slot(static_cast<size_t>(c.max_seqs - 1), 2 * cp);
  if (layout == CpLayout::kContiguous) {
    int64_t rows = 0;
    for (size_t i = 0; i < every_slot.size(); ++i) {
      every_slot[i] = std::min<int64_t>(i % 2 == 0 ? 2 : 0, c.max_tokens - rows);
      rows += every_slot[i];
    }
  }
  out.push_back(every_slot);
  out.push_back({0, 3, 0, 0, 17, 0, 2 * cp + 1});
  out.push_back({1, 9});
  Rng rng(seed);
  while (out.size() < 20) {
    std::vector<int64_t> lengths;
    const int docs = static_cast<int>(rng.uniform_int(1, 60));
    for (int d = 0; d < docs; ++d) lengths.push_back(rng.uniform_int(0, c.max_tokens / 4));
    while (padded_rows(lengths, cp, layout) > c.max_tokens) lengths.pop_back();
    if (lengths.empty()) continue;
    if (out.size() % 2 == 0) {  // use exactly max_tokens rows
      const int64_t slack = c.max_tokens - padded_rows(lengths, cp, layout);
      lengths.back() = (layout == CpLayout::kDualChunk ? cp_padded_length(lengths.back(), cp) : lengths.back()) + slack;
    }
    out.push_back(lengths);
  }
  return out;
}

std::vector<graph::GraphBank::How> run_packings(DeviceCommunicator& comm, graph::GraphBank& bank,
                                                const Capacity& capacity,
                                                const std::vector<std::vector<int64_t>>& lengths,
                                                const std::vector<Batch>& batches, const Shape& s,
                                                const CpMode& mode) {
  BankRank rank(comm, bank, capacity.max_tokens, s, mode);
  rank.warm_up();
  std::vector<graph::GraphBank::How> how;
  for (size_t i = 0; i < lengths.size(); ++i) {
    SCOPED_TRACE("rank " + std::to_string(comm.rank()) + " packing " + std::to_string(i));
    GraphBank::Outcome outcome;
    const Outputs banked = rank.banked(bank, batches[i], lengths[i], &outcome);
    how.push_back(outcome.how);
    const Outputs eager = rank.eager(batches[i], lengths[i], capacity);
    EXPECT_TRUE(identical(banked, eager)) << graph::GraphBank::how_name(how.back()) << " vs eager";
    expect_matches_reference(banked, batches[i], s.mask, comm.size(), comm.rank(), bank.cp_layout());
  }
  return how;
}

Packings make_packings(int cp, const Capacity& capacity, const Shape& s, size_t count) {
  Packings p;
  p.lengths = packings(cp, capacity, 21 + static_cast<uint64_t>(cp));
  p.lengths.resize(count);
  for (size_t i = 0; i < p.lengths.size(); ++i) {
    p.batches.push_back(batch_of(p.lengths[i], cp, capacity, s, 500 + i));
  }
  return p;
}

}  // namespace thdcp::test
