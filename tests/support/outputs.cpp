#include "support/outputs.h"

#include <cmath>
#include <cstring>
#include <utility>

namespace thdcp::test {

Outputs outputs_for(const Batch& b, int64_t rows, DType dq_dtype, DType dkv_dtype) {
  Outputs o;
  o.out = HostTensor(b.q.dtype(), rows, b.q.heads(), b.q.head_dim());
  o.dq = HostTensor(dq_dtype, rows, b.q.heads(), b.q.head_dim());
  o.dk = HostTensor(dkv_dtype, rows, b.k.heads(), b.k.head_dim());
  o.dv = HostTensor(dkv_dtype, rows, b.k.heads(), b.k.head_dim());
  o.lse.resize(static_cast<size_t>(b.q.heads() * rows));
  o.max_logit.resize(static_cast<size_t>(b.q.heads()));
  return o;
}

void poison(Outputs& o) {
  for (HostTensor* t : {&o.out, &o.dq, &o.dk, &o.dv}) poison(*t);
  poison(o.lse);
  poison(o.max_logit);
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  const size_t bytes = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
  return a.numel() == b.numel() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), bytes) == 0;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

::testing::AssertionResult identical(const Outputs& a, const Outputs& b) {
  if (!same_bits(a.out, b.out)) return ::testing::AssertionFailure() << "out differs";
  if (!same_bits(a.lse, b.lse)) return ::testing::AssertionFailure() << "lse differs";
  if (!same_bits(a.max_logit, b.max_logit)) return ::testing::AssertionFailure() << "max_logit differs";
  if (!same_bits(a.dq, b.dq)) return ::testing::AssertionFailure() << "dq differs";
  if (!same_bits(a.dk, b.dk)) return ::testing::AssertionFailure() << "dk differs";
  if (!same_bits(a.dv, b.dv)) return ::testing::AssertionFailure() << "dv differs";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_written(const Outputs& o) {
  for (auto [name, t] : {std::make_pair("out", &o.out), std::make_pair("dq", &o.dq), std::make_pair("dk", &o.dk),
                         std::make_pair("dv", &o.dv)}) {
    if (t->numel() == 0) return ::testing::AssertionFailure() << name << " is empty";
    for (int64_t i = 0; i < t->numel(); ++i) {
      if (std::isnan(t->get(i))) return ::testing::AssertionFailure() << name << "[" << i << "] is NaN: never written";
    }
  }
  for (auto [name, v] : {std::make_pair("lse", &o.lse), std::make_pair("max_logit", &o.max_logit)}) {
    if (v->empty()) return ::testing::AssertionFailure() << name << " is empty";
    for (size_t i = 0; i < v->size(); ++i) {
      if (std::isnan((*v)[i])) return ::testing::AssertionFailure() << name << "[" << i << "] is NaN: never written";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace thdcp::test
