#include "kv_ledger.h"

#include <cstring>
#include <map>
#include <mutex>

namespace thdcp::cp::detail {

namespace {

struct Entry {
  int plans = 0;
  bool written = false;  // `last` holds a forward that no backward or other plan has followed
  ForwardStamp last;
};

std::mutex& ledger_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Never destroyed: plans may outlive static destruction order at exit.
std::map<const void*, Entry>& ledger() {
  static auto* entries = new std::map<const void*, Entry>();
  return *entries;
}

bool same(const ForwardStamp& a, const ForwardStamp& b) {
  return a.plan == b.plan && a.q == b.q && a.k == b.k && a.v == b.v && a.out == b.out && a.lse == b.lse &&
         std::memcmp(a.strides, b.strides, sizeof(a.strides)) == 0 && a.cu_seqlens == b.cu_seqlens &&
         a.cu_seqlens_padded == b.cu_seqlens_padded && a.stream == b.stream;
}

template <typename Q, typename K, typename V>
ForwardStamp stamp(const void* plan, const DeviceLayout& layout, const Q& q, const K& k, const V& v, const void* out,
                   const float* lse, cudaStream_t stream) {
  ForwardStamp s;
  s.plan = plan;
  s.q = q.data;
  s.k = k.data;
  s.v = v.data;
  s.out = out;
  s.lse = lse;
  const int64_t strides[6] = {q.row_step(), q.head_step(), k.row_step(), k.head_step(), v.row_step(), v.head_step()};
  std::memcpy(s.strides, strides, sizeof(strides));
  s.cu_seqlens = layout.cu_seqlens;
  s.cu_seqlens_padded = layout.cu_seqlens_padded;
  s.stream = stream;
  return s;
}

}  // namespace

ForwardStamp stamp_of(const void* plan, const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream) {
  return stamp(plan, layout, t.q, t.k, t.v, t.out.data, t.lse, stream);
}

ForwardStamp stamp_of(const void* plan, const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream) {
  return stamp(plan, layout, t.q, t.k, t.v, t.out.data, t.lse, stream);
}

void ledger_enter(const void* base) {
  std::lock_guard<std::mutex> lock(ledger_mutex());
  Entry& e = ledger()[base];
  ++e.plans;
  e.written = false;  // a new plan over this memory: nothing in it is anyone's forward
}

void ledger_leave(const void* base) {
  std::lock_guard<std::mutex> lock(ledger_mutex());
  auto it = ledger().find(base);
  if (it == ledger().end()) return;
  if (--it->second.plans <= 0) {
    ledger().erase(it);
  } else {
    it->second.written = false;
  }
}

void ledger_forward(const void* base, const ForwardStamp& stamp) {
  std::lock_guard<std::mutex> lock(ledger_mutex());
  auto it = ledger().find(base);
  if (it == ledger().end()) return;
  it->second.last = stamp;
  it->second.written = true;
}

bool ledger_backward(const void* base, const ForwardStamp& stamp) {
  std::lock_guard<std::mutex> lock(ledger_mutex());
  auto it = ledger().find(base);
  if (it == ledger().end()) return false;
  const bool reuse = it->second.written && same(it->second.last, stamp);
  it->second.written = false;
  return reuse;
}

}  // namespace thdcp::cp::detail
