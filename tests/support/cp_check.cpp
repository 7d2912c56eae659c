#include "support/cp_check.h"

#include <limits>
#include <string>
#include <tuple>

namespace thdcp::test {

cp::Problem cp_problem(int cp, const Capacity& capacity, const Shape& s) {
  cp::Problem problem;
  problem.cp = cp;
  problem.capacity = capacity;
  problem.mask = s.mask;
  static_cast<HeadShape&>(problem) = s.heads();
  problem.dtype = s.dtype;
  return problem;
}

Outputs single_device(const Batch& b, const Mask& mask, const AttentionOptions& options) {
  std::vector<float> no_dsinks;
  return single_device(b, mask, options, {}, no_dsinks);
}

Outputs single_device(const Batch& b, const Mask& mask, const AttentionOptions& options,
                      const std::vector<float>& sinks, std::vector<float>& dsinks) {
  Outputs r = outputs_for(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  dsinks.assign(sinks.size(), std::numeric_limits<float>::quiet_NaN());
  cpu_reference(build_segment_table(b.layout.view(), mask), b, options, sinks.empty() ? nullptr : sinks.data(),
                sinks.empty() ? nullptr : dsinks.data(), r);
  return r;
}

HostTensor local_part(const HostTensor& global, const LayoutView& layout, int cp, int rank, CpLayout cp_layout) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  split_for_rank(global.data(), local.data(), global.row_bytes(), layout, cp, rank, cp_layout);
  return local;
}

std::vector<float> local_lse(const std::vector<float>& global, int64_t heads, const LayoutView& layout, int cp,
                             int rank, CpLayout cp_layout) {
  const int64_t rows = layout.total_rows(), local_rows = rows / cp;
  std::vector<float> local(static_cast<size_t>(heads * local_rows));
  for (int64_t h = 0; h < heads; ++h) {
    split_for_rank(global.data() + h * rows, local.data() + h * local_rows, sizeof(float), layout, cp, rank,
                   cp_layout);
  }
  return local;
}

Outputs local_outputs(const Outputs& global, const LayoutView& layout, int cp, int rank, CpLayout cp_layout) {
  Outputs local;
  local.out = local_part(global.out, layout, cp, rank, cp_layout);
  local.dq = local_part(global.dq, layout, cp, rank, cp_layout);
  local.dk = local_part(global.dk, layout, cp, rank, cp_layout);
  local.dv = local_part(global.dv, layout, cp, rank, cp_layout);
  local.lse = local_lse(global.lse, global.out.heads(), layout, cp, rank, cp_layout);
  local.max_logit = global.max_logit;
  return local;
}

namespace {

// Every output of a rank's step against the reference rows it owns. Both sides use fp32
// arithmetic and round to storage once; dK/dV may be summed in another order (per rank, then
// across ranks).
::testing::AssertionResult compare_rank(const Outputs& got, const Outputs& expected, DType dtype,
                                        const AttentionOptions& options, const std::string& where) {
  const Tolerance storage = derive_tolerance(dtype, options.accumulate, 2);
  const Tolerance fp32 = derive_tolerance(DType::kFloat32, options.accumulate, 2);
  for (auto [name, actual, wanted] :
       {std::make_tuple("out", &got.out, &expected.out), std::make_tuple("dq", &got.dq, &expected.dq),
        std::make_tuple("dk", &got.dk, &expected.dk), std::make_tuple("dv", &got.dv, &expected.dv)}) {
    auto r = matches(name, *actual, *wanted, storage);
    if (!r) return ::testing::AssertionFailure() << where << r.message();
  }
  auto r = matches("lse", got.lse, expected.lse, fp32);
  if (!r) return ::testing::AssertionFailure() << where << r.message();
  r = matches("max_logit", got.max_logit, expected.max_logit, fp32);
  if (!r) return ::testing::AssertionFailure() << where << r.message();
  return ::testing::AssertionSuccess();
}

}  // namespace

::testing::AssertionResult check_cp_rank(Communicator& comm, const Batch& b, const Mask& mask,
                                         const Outputs& reference, const AttentionOptions& options) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const HostTensor q = local_part(b.q, layout, cp, rank), k = local_part(b.k, layout, cp, rank),
                   v = local_part(b.v, layout, cp, rank), dout = local_part(b.dout, layout, cp, rank);
  Outputs got = poisoned_outputs(b, q.tokens(), q.dtype(), k.dtype());
  cp::forward(comm, layout, mask, q.view(), k.view(), v.view(), got.out.view(), got.lse.data(), got.max_logit.data(),
              options);
  cp::backward(comm, layout, mask, q.view(), k.view(), v.view(), got.out.view(), dout.view(), got.lse.data(),
               got.dq.view(), got.dk.view(), got.dv.view(), options);

  const std::string where = "cp " + std::to_string(cp) + " rank " + std::to_string(rank) + ": ";
  return compare_rank(got, local_outputs(reference, layout, cp, rank), b.q.dtype(), options, where);
}

Outputs cp_plan_rank_outputs(Communicator& comm, const Batch& b, const cp::Problem& problem,
                             const AttentionOptions& options, const std::vector<float>& sinks,
                             std::vector<float>* dsinks) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const CpLayout split = problem.layout;
  const HostTensor q = local_part(b.q, layout, cp, rank, split), k = local_part(b.k, layout, cp, rank, split),
                   v = local_part(b.v, layout, cp, rank, split), dout = local_part(b.dout, layout, cp, rank, split);
  Outputs got = poisoned_outputs(b, q.tokens(), q.dtype(), k.dtype());
  std::vector<float> got_dsinks(sinks.size(), std::numeric_limits<float>::quiet_NaN());
  const float* sink_values = sinks.empty() ? nullptr : sinks.data();
  cp::CpuPlan plan(comm, problem, options);
  plan.forward(layout,
               ForwardTensors{q.view(), k.view(), v.view(), got.out.view(), got.lse.data(), got.max_logit.data(),
                              sink_values});
  BackwardTensors t{q.view(),      k.view(),      v.view(),      got.out.view(), dout.view(), got.lse.data(),
                    got.dq.view(), got.dk.view(), got.dv.view()};
  t.sinks = sink_values;
  t.dsinks = sinks.empty() ? nullptr : got_dsinks.data();
  plan.backward(layout, t);
  if (dsinks) *dsinks = got_dsinks;
  return got;
}

::testing::AssertionResult check_cp_plan_rank(Communicator& comm, const Batch& b, const cp::Problem& problem,
                                              const Outputs& reference, const AttentionOptions& options,
                                              const std::vector<float>& sinks,
                                              const std::vector<float>& reference_dsinks, std::vector<float>* dsinks) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const CpLayout split = problem.layout;
  std::vector<float> got_dsinks;
  const Outputs got = cp_plan_rank_outputs(comm, b, problem, options, sinks, &got_dsinks);

  const std::string where = std::string(cp_layout_name(split)) + " " + cp::cp_comm_name(problem.comm) + " cp " +
                            std::to_string(cp) + " rank " + std::to_string(rank) + ": ";
  auto r = compare_rank(got, local_outputs(reference, layout, cp, rank, split), b.q.dtype(), options, where);
  if (r && !sinks.empty()) {
    r = matches("dsinks", got_dsinks, reference_dsinks, derive_tolerance(DType::kFloat32, options.accumulate, 2));
    if (!r) r = ::testing::AssertionFailure() << where << r.message();
  }
  if (dsinks) *dsinks = got_dsinks;
  return r;
}

std::vector<std::string> plan_messages(const cp::Problem& problem, const cp::Problem& other) {
  std::vector<std::string> messages(static_cast<size_t>(problem.cp));
  try {
    run_in_process(problem.cp, [&](Communicator& comm) {
      try {
        cp::CpuPlan plan(comm, comm.rank() == 1 ? other : problem);
      } catch (const Error& e) {
        messages[static_cast<size_t>(comm.rank())] = e.what();
        throw;
      }
    });
  } catch (const Error&) {
  }
  return messages;
}

void expect_every_rank_says(const std::vector<std::string>& messages, const std::string& wanted) {
  for (size_t r = 0; r < messages.size(); ++r) {
    EXPECT_NE(messages[r].find(wanted), std::string::npos) << "rank " << r << ": " << messages[r];
  }
}

void expect_cp_plan_matches_single_device(const Batch& b, const Mask& mask, const cp::Problem& problem,
                                          const std::vector<float>& sinks) {
  AttentionOptions options;
  options.num_threads = 1;
  std::vector<float> reference_dsinks;
  const Outputs reference = single_device(b, mask, options, sinks, reference_dsinks);
  const int cp = problem.cp;
  std::vector<::testing::AssertionResult> results(static_cast<size_t>(cp), ::testing::AssertionSuccess());
  std::vector<std::vector<float>> dsinks(static_cast<size_t>(cp));
  run_in_process(cp, [&](Communicator& comm) {
    const size_t rank = static_cast<size_t>(comm.rank());
    results[rank] = check_cp_plan_rank(comm, b, problem, reference, options, sinks, reference_dsinks, &dsinks[rank]);
  });
  for (const auto& r : results) EXPECT_TRUE(r);
  for (int r = 1; r < cp; ++r) EXPECT_TRUE(same_bits(dsinks[static_cast<size_t>(r)], dsinks[0])) << "rank " << r;
}

bool expect_reduced_gradients(const std::vector<Outputs>& rounded, const std::vector<Outputs>& exact,
                              const Outputs& reference, const Batch& b, CpLayout layout, const Tolerance& grads) {
  const int cp = static_cast<int>(rounded.size());
  bool differs = false;
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const Outputs& got = rounded[static_cast<size_t>(rank)];
    const Outputs& fp32 = exact[static_cast<size_t>(rank)];
    EXPECT_TRUE(same_bits(got.out, fp32.out));
    EXPECT_TRUE(same_bits(got.lse, fp32.lse));
    EXPECT_TRUE(same_bits(got.max_logit, fp32.max_logit));
    EXPECT_TRUE(same_bits(got.dq, fp32.dq));
    const Outputs want = local_outputs(reference, b.layout.view(), cp, rank, layout);
    EXPECT_TRUE(matches("dk", got.dk, want.dk, grads));
    EXPECT_TRUE(matches("dv", got.dv, want.dv, grads));
    differs = differs || !same_bits(got.dk, fp32.dk) || !same_bits(got.dv, fp32.dv);
  }
  return differs;
}

}  // namespace thdcp::test
