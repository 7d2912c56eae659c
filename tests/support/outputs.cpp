#include "support/outputs.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

namespace thdcp::test {

Outputs outputs_for(const Batch& b, int64_t rows, DType dq_dtype, DType dkv_dtype) {
  Outputs o;
  o.out = HostTensor(b.q.dtype(), rows, b.q.heads(), b.v.head_dim());
  o.dq = HostTensor(dq_dtype, rows, b.q.heads(), b.q.head_dim());
  o.dk = HostTensor(dkv_dtype, rows, b.k.heads(), b.k.head_dim());
  o.dv = HostTensor(dkv_dtype, rows, b.v.heads(), b.v.head_dim());
  o.lse.resize(static_cast<size_t>(b.q.heads() * rows));
  o.max_logit.resize(static_cast<size_t>(b.q.heads()));
  return o;
}

void poison(Outputs& o) {
  for (HostTensor* t : {&o.out, &o.dq, &o.dk, &o.dv}) poison(*t);
  poison(o.lse);
  poison(o.max_logit);
}

Outputs poisoned_outputs(const Batch& b, int64_t rows, DType dq_dtype, DType dkv_dtype) {
  Outputs o = outputs_for(b, rows, dq_dtype, dkv_dtype);
  poison(o);
  return o;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  const size_t bytes = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
  // (an empty tensor's data() may be null, which memcmp does not take)
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         (bytes == 0 || std::memcmp(a.data(), b.data(), bytes) == 0);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

namespace {

// Where two buffers of the same size first differ, for a failure message.
std::string first_difference(const void* a, const void* b, size_t bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  size_t i = 0;
  while (i < bytes && x[i] == y[i]) ++i;
  return i < bytes ? " at byte " + std::to_string(i) : " in size or dtype";
}

std::string first_difference(const HostTensor& a, const HostTensor& b) {
  if (a.numel() != b.numel() || a.dtype() != b.dtype()) return " in size or dtype";
  return first_difference(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype()));
}

std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return " in size";
  return first_difference(a.data(), b.data(), a.size() * sizeof(float));
}

}  // namespace

::testing::AssertionResult identical(const Outputs& a, const Outputs& b) {
  for (auto [name, x, y] : {std::make_tuple("out", &a.out, &b.out), std::make_tuple("dq", &a.dq, &b.dq),
                            std::make_tuple("dk", &a.dk, &b.dk), std::make_tuple("dv", &a.dv, &b.dv)}) {
    if (!same_bits(*x, *y)) return ::testing::AssertionFailure() << name << " differs" << first_difference(*x, *y);
  }
  for (auto [name, x, y] :
       {std::make_tuple("lse", &a.lse, &b.lse), std::make_tuple("max_logit", &a.max_logit, &b.max_logit)}) {
    if (!same_bits(*x, *y)) return ::testing::AssertionFailure() << name << " differs" << first_difference(*x, *y);
  }
  return ::testing::AssertionSuccess();
}

void cpu_reference(const SegmentTable& table, const Batch& b, const AttentionOptions& options, Outputs& r) {
  cpu_reference(table, b, options, nullptr, nullptr, r);
}

void cpu_reference(const SegmentTable& table, const Batch& b, const AttentionOptions& options, const float* sinks,
                   float* dsinks, Outputs& r) {
  cpu::attention_forward(
      table, ForwardTensors{b.q.view(), b.k.view(), b.v.view(), r.out.view(), r.lse.data(), r.max_logit.data(), sinks},
      options);
  BackwardTensors g{b.q.view(), b.k.view(), b.v.view(), r.out.view(), b.dout.view(), r.lse.data(),
                    r.dq.view(),  r.dk.view(), r.dv.view()};
  g.sinks = sinks;
  g.dsinks = dsinks;
  cpu::attention_backward(table, g, options);
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
