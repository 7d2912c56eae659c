#include "support/cp_halo_step.h"

#include <limits>

#include "support/cp_check.h"

namespace thdcp::test {

void CountingCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  received += static_cast<int64_t>(bytes) * (size() - 1);
  inner_.all_gather(send, recv, bytes);
}

void CountingCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t count) {
  received += static_cast<int64_t>(count * sizeof(float)) * (size() - 1);
  inner_.reduce_scatter_sum(send, recv, count);
}

void CountingCommunicator::all_to_all_v(const void* send, const size_t* send_bytes, void* recv,
                                        const size_t* recv_bytes) {
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) received += static_cast<int64_t>(recv_bytes[r]);
  }
  inner_.all_to_all_v(send, send_bytes, recv, recv_bytes);
}

RankStep run_counted_step(Communicator& comm, const Batch& b, const cp::Problem& problem,
                          const std::vector<float>& sinks) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const CpLayout split = problem.layout;
  const HostTensor q = local_part(b.q, layout, cp, rank, split), k = local_part(b.k, layout, cp, rank, split),
                   v = local_part(b.v, layout, cp, rank, split), dout = local_part(b.dout, layout, cp, rank, split);
  RankStep step;
  step.outputs = poisoned_outputs(b, q.tokens(), q.dtype(), k.dtype());
  step.dsinks.assign(sinks.size(), std::numeric_limits<float>::quiet_NaN());
  Outputs& o = step.outputs;
  AttentionOptions options;
  options.num_threads = 1;
  CountingCommunicator counting(comm);
  cp::CpuPlan plan(counting, problem, options);
  if (problem.comm != cp::CpComm::kAllToAll) step.traffic = plan.kv_traffic(layout);  // all_to_all gathers no K/V
  const float* sink_values = sinks.empty() ? nullptr : sinks.data();
  counting.received = 0;
  plan.forward(layout, ForwardTensors{q.view(), k.view(), v.view(), o.out.view(), o.lse.data(), o.max_logit.data(),
                                      sink_values});
  step.forward_bytes = counting.received;
  BackwardTensors t{q.view(), k.view(), v.view(), o.out.view(), dout.view(), o.lse.data(),
                    o.dq.view(), o.dk.view(), o.dv.view()};
  t.sinks = sink_values;
  t.dsinks = sinks.empty() ? nullptr : step.dsinks.data();
  counting.received = 0;
  plan.backward(layout, t);
  step.backward_bytes = counting.received - static_cast<int64_t>(sinks.size() * sizeof(float)) * (cp - 1);
  return step;
}

}  // namespace thdcp::test
