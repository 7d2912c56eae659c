#include "step/graph_step.h"

#include <cstring>
#include <string>

#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

GraphStep::GraphStep(graph::GraphBank& bank, const GraphStepShape& shape, int64_t max_tokens,
                     graph::WorkspaceArena* arena)
    : bank_(bank), arena_(arena), shape_(shape), max_tokens_(max_tokens), rows_(max_tokens / bank.cp()) {
  if (arena_) {
    for (const Capacity& c : bank.run_capacities()) arena_->reserve(cp::cuda_workspace_size(cp_problem_at(c)));
  }
  const Capacity key = default_capacity(max_tokens, bank.cp(), bank.cp_layout());  // buffers live under this key
  for (int l = 0; l < shape.layers; ++l) {
    const std::string p = "layer " + std::to_string(l) + " ";
    auto tensor = [&](const char* name, int64_t heads) {
      return ThdTensor{bank.buffer(key, p + name, shape.bytes(rows_, heads)), shape.dtype, rows_, heads,
                       shape.head_dim};
    };
    Layer layer{};
    layer.q = tensor("q", shape.q_heads);
    layer.k = tensor("k", shape.kv_heads);
    layer.v = tensor("v", shape.kv_heads);
    layer.out = tensor("out", shape.q_heads);
    layer.dout = tensor("dout", shape.q_heads);
    layer.dq = tensor("dq", shape.q_heads);
    layer.dk = tensor("dk", shape.kv_heads);
    layer.dv = tensor("dv", shape.kv_heads);
    layer.lse = static_cast<float*>(bank.buffer(key, p + "lse", sizeof(float) * static_cast<size_t>(rows_ * shape.q_heads)));
    layers_.push_back(layer);
  }
  max_logit_ = static_cast<float*>(bank.buffer(key, "max_logit", sizeof(float) * static_cast<size_t>(shape.q_heads)));
}

void GraphStep::load_inputs(uint64_t seed, cudaStream_t stream) {
  inputs_.clear();
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (int t = 0; t < 4; ++t) {
      const int64_t heads = (t == 1 || t == 2) ? shape_.kv_heads : shape_.q_heads;
      HostTensor host(shape_.dtype, rows_, heads, shape_.head_dim);
      fill_normal(host, seed * 1000003u + l * 4u + static_cast<uint64_t>(t));
      const unsigned char* p = static_cast<const unsigned char*>(host.data());
      inputs_.emplace_back(p, p + static_cast<size_t>(host.numel()) * dtype_size(shape_.dtype));
    }
  }
  reload_inputs(stream);
}

void GraphStep::reload_inputs(cudaStream_t stream) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const ThdTensor* targets[4] = {&layers_[l].q, &layers_[l].k, &layers_[l].v, &layers_[l].dout};
    for (int t = 0; t < 4; ++t) {
      const auto& host = inputs_[l * 4 + static_cast<size_t>(t)];
      THDCP_CHECK_CUDA(cudaMemcpyAsync(targets[t]->data, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
    }
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

cp::Problem GraphStep::cp_problem_at(const Capacity& capacity) const {
  return cp_problem(shape_, bank_.cp(), capacity, shape_.mask, bank_.cp_layout(), shape_.cp_comm, cp::KvGather::kAuto,
                    shape_.a2a_size);
}

cp::CudaPlan& GraphStep::cp_plan(const Capacity& capacity) {
  auto it = cp_plans_.find(capacity);
  if (it != cp_plans_.end()) return *it->second;
  const cp::Problem problem = cp_problem_at(capacity);
  const size_t bytes = cp::cuda_workspace_size(problem);
  // One workspace per capacity, shared by every layer (they run in order on one stream); or
  // the arena every capacity and CP size of this rank shares.
  void* workspace = arena_ ? arena_->take(bytes) : bank_.buffer(capacity, "cp workspace", bytes);
  auto plan = std::make_unique<cp::CudaPlan>(bank_.communicator(), problem, AttentionOptions{}, workspace, bytes);
  return *cp_plans_.emplace(capacity, std::move(plan)).first->second;
}

const cuda::RopePlan& GraphStep::rope_plan(const Capacity& capacity) {
  auto it = rope_plans_.find(capacity);
  if (it != rope_plans_.end()) return *it->second;
  cuda::RopeShape s;
  static_cast<HeadShape&>(s) = shape_.heads();
  s.cp = bank_.cp();
  s.rank = bank_.communicator().rank();
  s.cp_layout = bank_.cp_layout();
  s.capacity = capacity;
  s.dtype = shape_.dtype;
  s.config = shape_.rope_config;
  return *rope_plans_.emplace(capacity, std::make_unique<cuda::RopePlan>(s)).first->second;
}

graph::Work GraphStep::work() {
  return [this](const graph::StaticBatch& batch, cudaStream_t stream) {
    const Capacity& c = batch.capacity();
    THDCP_CHECK(c.max_tokens == max_tokens_, "GraphStep: batch capacity max_tokens=" << c.max_tokens
                                                                                     << " but buffers hold "
                                                                                     << max_tokens_);
    cp::CudaPlan& attention = cp_plan(c);
    const cuda::RopePlan* rope = shape_.rope ? &rope_plan(c) : nullptr;
    const DeviceLayout layout = batch.layout();
    for (const Layer& l : layers_) {
      if (rope) rope->forward(layout, nullptr, l.q, l.k, stream);
      attention.forward(layout, ForwardTensors{l.q, l.k, l.v, l.out, l.lse, max_logit_}, stream);
    }
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
      const Layer& l = *it;
      attention.backward(layout, BackwardTensors{l.q, l.k, l.v, l.out, l.dout, l.lse, l.dq, l.dk, l.dv}, stream);
      if (rope) rope->backward(layout, nullptr, l.dq, l.dk, stream);
    }
  };
}

std::vector<unsigned char> GraphStep::download_outputs(cudaStream_t stream) const {
  const size_t lse_bytes = sizeof(float) * static_cast<size_t>(rows_ * shape_.q_heads);
  std::vector<unsigned char> all;
  for (const Layer& l : layers_) {
    for (auto [p, n] : {std::make_pair(l.out.data, shape_.bytes(rows_, shape_.q_heads)),
                        std::make_pair(l.dq.data, shape_.bytes(rows_, shape_.q_heads)),
                        std::make_pair(l.dk.data, shape_.bytes(rows_, shape_.kv_heads)),
                        std::make_pair(l.dv.data, shape_.bytes(rows_, shape_.kv_heads)),
                        std::make_pair(static_cast<void*>(l.lse), lse_bytes)}) {
      const size_t at = all.size();
      all.resize(at + n);
      THDCP_CHECK_CUDA(cudaMemcpyAsync(all.data() + at, p, n, cudaMemcpyDeviceToHost, stream));
    }
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  return all;
}

}  // namespace thdcp::tools
