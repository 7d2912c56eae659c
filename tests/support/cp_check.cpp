#include "support/cp_check.h"

#include <string>
#include <tuple>

namespace thdcp::test {

GlobalResult single_device(const Batch& b, const Mask& mask, const AttentionOptions& options) {
  GlobalResult r;
  const int64_t rows = b.q.tokens();
  r.out = HostTensor(b.q.dtype(), rows, b.q.heads(), b.q.head_dim());
  r.dq = HostTensor(b.q.dtype(), rows, b.q.heads(), b.q.head_dim());
  r.dk = HostTensor(b.k.dtype(), rows, b.k.heads(), b.k.head_dim());
  r.dv = HostTensor(b.k.dtype(), rows, b.k.heads(), b.k.head_dim());
  r.lse.resize(static_cast<size_t>(b.q.heads() * rows));
  r.max_logit.resize(static_cast<size_t>(b.q.heads()));
  const SegmentTable table = build_segment_table(b.layout.view(), mask);
  cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), r.out.view(), r.lse.data(), r.max_logit.data(),
                         options);
  cpu::attention_backward(table, b.q.view(), b.k.view(), b.v.view(), r.out.view(), b.dout.view(), r.lse.data(),
                          r.dq.view(), r.dk.view(), r.dv.view(), options);
  return r;
}

HostTensor local_part(const HostTensor& global, const LayoutView& layout, int cp, int rank) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  split_for_rank(global.data(), local.data(), global.row_bytes(), layout, cp, rank);
  return local;
}

std::vector<float> local_lse(const std::vector<float>& global, int64_t heads, const LayoutView& layout, int cp,
                             int rank) {
  const int64_t rows = layout.total_rows(), local_rows = rows / cp;
  std::vector<float> local(static_cast<size_t>(heads * local_rows));
  for (int64_t h = 0; h < heads; ++h) {
    split_for_rank(global.data() + h * rows, local.data() + h * local_rows, sizeof(float), layout, cp, rank);
  }
  return local;
}

::testing::AssertionResult check_cp_rank(Communicator& comm, const Batch& b, const Mask& mask,
                                         const GlobalResult& reference, const AttentionOptions& options) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const HostTensor q = local_part(b.q, layout, cp, rank), k = local_part(b.k, layout, cp, rank),
                   v = local_part(b.v, layout, cp, rank), dout = local_part(b.dout, layout, cp, rank);
  HostTensor out(q.dtype(), q.tokens(), q.heads(), q.head_dim()), dq(q.dtype(), q.tokens(), q.heads(), q.head_dim());
  HostTensor dk(k.dtype(), k.tokens(), k.heads(), k.head_dim()), dv(k.dtype(), k.tokens(), k.heads(), k.head_dim());
  std::vector<float> lse(static_cast<size_t>(q.heads() * q.tokens())), max_logit(static_cast<size_t>(q.heads()));
  for (HostTensor* t : {&out, &dq, &dk, &dv}) poison(*t);
  poison(lse);
  poison(max_logit);
  cp::forward(comm, layout, mask, q.view(), k.view(), v.view(), out.view(), lse.data(), max_logit.data(), options);
  cp::backward(comm, layout, mask, q.view(), k.view(), v.view(), out.view(), dout.view(), lse.data(), dq.view(),
               dk.view(), dv.view(), options);

  // Both sides use fp32 arithmetic and round to storage once; dK/dV are summed in another
  // order (per rank, then across ranks).
  const Tolerance storage = derive_tolerance(b.q.dtype(), options.accumulate, 2);
  const Tolerance fp32 = derive_tolerance(DType::kFloat32, options.accumulate, 2);
  const std::string where = "cp " + std::to_string(cp) + " rank " + std::to_string(rank) + ": ";
  for (auto [name, got, ref] : {std::make_tuple("out", &out, &reference.out), std::make_tuple("dq", &dq, &reference.dq),
                                std::make_tuple("dk", &dk, &reference.dk), std::make_tuple("dv", &dv, &reference.dv)}) {
    const HostTensor expected = local_part(*ref, layout, cp, rank);
    auto r = matches(name, *got, expected, storage);
    if (!r) return ::testing::AssertionFailure() << where << r.message();
  }
  auto r = matches("lse", lse, local_lse(reference.lse, q.heads(), layout, cp, rank), fp32);
  if (!r) return ::testing::AssertionFailure() << where << r.message();
  r = matches("max_logit", max_logit, reference.max_logit, fp32);
  if (!r) return ::testing::AssertionFailure() << where << r.message();
  return ::testing::AssertionSuccess();
}

}  // namespace thdcp::test
