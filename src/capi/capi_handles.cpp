// The registry of live handles (capi_handles.h): one process-wide map from handle values to
// objects, behind one mutex held only to find, add or remove an entry.
#include "capi_handles.h"

#include <mutex>
#include <sstream>
#include <unordered_map>

namespace thdcp::capi::detail {

namespace {

struct KindInfo {
  const char* type;     // the C type, "thdcp_cp_plan_t"
  const char* made_by;  // what returns one
  const char* destroy;  // what ends one
};

const KindInfo& info(HandleKind kind) {
  static const KindInfo infos[] = {
      {"thdcp_attention_plan_t", "thdcp_attention_plan_create", "thdcp_attention_plan_destroy"},
      {"thdcp_communicator_t", "a thdcp_communicator_create_* function or thdcp_communicator_borrow_nccl",
       "thdcp_communicator_destroy"},
      {"thdcp_cp_plan_t", "thdcp_cp_plan_create", "thdcp_cp_plan_destroy"},
      {"thdcp_graph_bank_t", "thdcp_graph_bank_create", "thdcp_graph_bank_destroy"},
  };
  return infos[static_cast<int>(kind)];
}

struct Entry {
  HandleKind kind;
  std::shared_ptr<void> object;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<uintptr_t, Entry> live;
  uintptr_t serial = 0;  // handles made so far
};

// Never destroyed: a handle the caller did not destroy is not released after main returns,
// when CUDA, NCCL or MPI may be gone already (such objects stay reachable, not leaked).
Registry& registry() {
  static Registry* const instance = new Registry();
  return *instance;
}

// The value of the serial-th handle: the serial times an odd constant, modulo 2^bits, is a
// bijection, so values are unique for the life of the process and never 0 (serials start at
// 1); they are neither small integers nor heap-like addresses, so a foreign value is not
// found by chance.
uintptr_t value_of(uintptr_t serial) { return serial * static_cast<uintptr_t>(0x9E3779B97F4A7C15ull); }

std::string hex(uintptr_t value) {
  std::ostringstream s;
  s << "0x" << std::hex << value;
  return s.str();
}

}  // namespace

std::vector<uintptr_t> publish(HandleKind kind, const std::vector<std::shared_ptr<void>>& objects) {
  std::vector<uintptr_t> values;
  values.reserve(objects.size());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.reserve(r.live.size() + objects.size());
  try {
    for (const std::shared_ptr<void>& object : objects) {
      const uintptr_t value = value_of(++r.serial);
      r.live.emplace(value, Entry{kind, object});
      values.push_back(value);
    }
  } catch (...) {
    for (uintptr_t value : values) r.live.erase(value);
    throw;
  }
  return values;
}

std::shared_ptr<void> find(HandleKind kind, uintptr_t value, const char* argument, bool retire) {
  const KindInfo& want = info(kind);
  if (value == 0) {
    throw ApiError(THDCP_ERROR_INVALID_ARGUMENT, std::string(argument) + " is NULL: pass a " + want.type +
                                                     " that " + want.made_by + " returned");
  }
  const KindInfo* other = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.live.find(value);
    if (it != r.live.end() && it->second.kind == kind) {
      std::shared_ptr<void> object = it->second.object;
      if (retire) r.live.erase(it);
      return object;
    }
    if (it != r.live.end()) other = &info(it->second.kind);
  }
  std::ostringstream message;
  message << argument << "=" << hex(value);
  if (other != nullptr) {
    message << " is a live " << other->type << ", not a " << want.type;
    if (retire) {
      message << ", so nothing was released: end it with " << other->destroy;
    } else {
      message << ": pass a " << want.type << " that " << want.made_by << " returned";
    }
  } else {
    message << " is not a live " << want.type;
    if (retire) message << ", so nothing was released";
    message << ": it was destroyed already";
    if (retire) message << " (destroy a handle once, then set it to NULL)";
    message << ", or " << want.made_by
            << " never returned it (uninitialised, zeroed or foreign memory cast to a handle)";
    if (!retire) message << "; pass a " << want.type << " that " << want.made_by << " returned and not yet destroyed";
  }
  throw ApiError(THDCP_ERROR_INVALID_HANDLE, message.str());
}

}  // namespace thdcp::capi::detail
