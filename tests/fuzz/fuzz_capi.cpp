// libFuzzer target: the C ABI (include/thdcp/thdcp.h) on the CPU backend, driven by the input
// read as a program of calls (capi_program.h): attention plans with fuzzed params structs
// (struct_size included), workspace queries, forward and backward runs; in-process groups
// and their queries; CP plans made and run by a thread per rank; destroys, double destroys,
// uses after destroy, foreign and wrong-kind handles; the layout and capacity helpers and the
// dual-chunk split. Every buffer a call is given is the harness's own, sized as the call's
// arguments describe it. At the end every live handle is destroyed, so anything the library
// still holds is a leak (LeakSanitizer).
//
// Findings, besides sanitizer reports and crashes (FUZZ_CHECK names the promise broken):
//  - a status outside the enum, THDCP_ERROR_INTERNAL, or a failure whose thdcp_last_error()
//    does not start with the function's name;
//  - a refused call that wrote an output (a handle, a size, an output tensor or array);
//  - a destroyed, foreign or wrong-kind handle that is not THDCP_ERROR_INVALID_HANDLE, a live
//    handle's destroy that fails;
//  - results the header defines that are wrong (padded rows, layouts, queries, the split);
//  - ranks of a collective plan create that disagree on success, a hang (libFuzzer -timeout).
// A program that asks for more than the harness gives (large runs, big groups in a
// collective) skips that call: the bounds are the constants below.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_checks.h"
#include "capi_helpers.h"
#include "capi_program.h"
#include "thdcp/thdcp.h"

namespace {

using namespace thdcp::fuzz;

// Collective calls run a thread per rank: groups of at most this many ranks make them.
constexpr int kMaxCollectiveRanks = 4;
// An attention run computes at most this many (query, key, head, dim) products (T^2 Hq D),
// on at most kMaxRunThreads threads.
constexpr int64_t kMaxRunWork = int64_t{1} << 22;
constexpr int32_t kMaxRunThreads = 4;
// A CP plan allocates its gathered K/V and fp32 partial sums when it is made: made only up to
// this many elements of max_tokens * (q_heads + kv_heads) * head_dim.
constexpr int64_t kMaxCpPlanElements = int64_t{1} << 18;

constexpr int kAttentionSlots = 4;
constexpr int kGroups = 3;
constexpr int kCpSets = 3;

template <typename H>
struct Slot {
  H handle = nullptr;
  bool live = false;
};

thdcp_dtype_t plan_dtype_or(thdcp_dtype_t given, thdcp_dtype_t plan) {
  return given == THDCP_DTYPE_DEFAULT ? plan : given;
}

// Runs body(rank) for ranks 0..n-1, rank 0 on this thread and the others on threads of their own.
template <typename Body>
void on_ranks(int n, Body body) {
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(body, r);
  body(0);
  for (std::thread& t : threads) t.join();
}

// An attention run's size is within the harness's bounds.
bool runnable(int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int32_t threads) {
  if (tokens < 0 || tokens > 4096 || q_heads < 1 || q_heads > 64 || kv_heads < 1 || kv_heads > 64 || head_dim < 1 ||
      head_dim > 256 || threads < 0 || threads > kMaxRunThreads) {
    return false;
  }
  return tokens * tokens * q_heads * head_dim <= kMaxRunWork;
}

class Harness {
 public:
  explicit Harness(Program& p) : p_(p) {}
  ~Harness() { destroy_all(); }

  void step() {
    switch (p_.u8() % 14) {
      case 0: attention_create(); break;
      case 1: attention_destroy(); break;
      case 2: attention_run(false); break;
      case 3: attention_run(true); break;
      case 4: group_create(); break;
      case 5: communicator_destroy(); break;
      case 6: communicator_query(); break;
      case 7: cp_create(); break;
      case 8: cp_destroy(); break;
      case 9: cp_run(p_.flag()); break;
      case 10: capacity_helpers(p_); break;
      case 11: split_merge(p_); break;
      case 12: library_calls(p_); break;
      default: foreign_handle(); break;
    }
  }

 private:
  struct AttentionSlot : Slot<thdcp_attention_plan_t> {
    thdcp_attention_params params{};  // as the library read them
  };
  struct CpSet {
    std::vector<Slot<thdcp_cp_plan_t>> ranks;
    thdcp_cp_params params{};
  };

  // ---- attention plans ----------------------------------------------------------------

  thdcp_attention_params decode_attention_params() {
    thdcp_attention_params v = THDCP_ATTENTION_PARAMS_INIT;
    v.backend = p_.value_backend();
    v.dtype = p_.value_dtype();
    v.max_tokens = p_.value_i64();
    v.q_heads = p_.value_i64();
    v.kv_heads = p_.value_i64();
    v.head_dim = p_.value_i64();
    v.max_seqs = p_.value_i32();
    v.window_left = p_.value_i32();
    v.window_right = p_.value_i32();
    v.softmax_scale = p_.value_float();
    if (p_.flag()) {
      v.deterministic = p_.u8();
      v.dq_dtype = p_.flag() ? THDCP_DTYPE_DEFAULT : p_.value_dtype();
      v.dkv_dtype = p_.flag() ? THDCP_DTYPE_DEFAULT : p_.value_dtype();
      v.num_threads = p_.value_i32();
    }
    return v;
  }

  void attention_create() {
    AttentionSlot& slot = attention_[p_.u8() % kAttentionSlots];
    const thdcp_attention_params value = decode_attention_params();
    const ParamsBuffer<thdcp_attention_params> params(p_, value, THDCP_ATTENTION_PARAMS_MIN_SIZE);
    const thdcp_attention_params* given = p_.u8() == 255 ? nullptr : params.get();
    size_t workspace = 12345;
    const thdcp_status_t sized = CALL(thdcp_attention_plan_workspace_size, given, &workspace);
    FUZZ_CHECK(sized == THDCP_SUCCESS ? workspace == 0 : workspace == 12345, "a CPU plan's workspace is 0 bytes");

    if (slot.live) expect(CALL(thdcp_attention_plan_destroy, slot.handle), THDCP_SUCCESS, "destroy a live plan");
    const bool null_out = p_.u8() == 255;
    thdcp_attention_plan_t made = sentinel<thdcp_attention_plan_t>();
    const thdcp_status_t status = CALL(thdcp_attention_plan_create, given, nullptr, 0, null_out ? nullptr : &made);
    // workspace_size validates the params as create does (the CPU backend needs no device).
    if (!null_out) FUZZ_CHECK(status == sized, "workspace_size and create judge the params alike");
    if (status != THDCP_SUCCESS) {
      FUZZ_CHECK(made == sentinel<thdcp_attention_plan_t>(), "a refused create wrote the plan");
      slot.live = false;
      return;
    }
    FUZZ_CHECK(made != nullptr && made != slot.handle, "a new plan has a new handle");
    const thdcp_attention_params defaults = THDCP_ATTENTION_PARAMS_INIT;
    slot.handle = made;
    slot.live = true;
    slot.params = as_read(value, given->struct_size, defaults);
  }

  void attention_destroy() {
    AttentionSlot& slot = attention_[p_.u8() % kAttentionSlots];
    expect(CALL(thdcp_attention_plan_destroy, slot.handle), expected_for(slot.handle, slot.live), "attention destroy");
    slot.live = false;  // the handle stays, now a destroyed one
  }

  // Forward or backward on a slot's plan with a layout and tensors of its shape (now and then
  // one that differs). A refused run must leave every output as it was.
  void attention_run(bool backward) {
    const AttentionSlot& slot = attention_[p_.u8() % kAttentionSlots];
    const thdcp_attention_params& a = slot.params;
    if (slot.live && !runnable(a.max_tokens, a.q_heads, a.kv_heads, a.head_dim, a.num_threads)) return;
    const int64_t rows = slot.live ? a.max_tokens : 4, hq = slot.live ? a.q_heads : 1;
    const int64_t hkv = slot.live ? a.kv_heads : 1, d = slot.live ? a.head_dim : 8;
    const thdcp_dtype_t dtype = slot.live ? a.dtype : THDCP_DTYPE_BF16;
    Layout layout;
    decode_layout(p_, 1 + p_.u8() % 4, rows, layout);
    const uint8_t fills[] = {0x3c, 0x00, 0xbc, 0x7f, 0xff};
    const uint8_t fill = fills[p_.u8() % 5];
    Tensor q, k, v, out, dout, dq, dk, dv;
    decode_tensor(p_, rows, hq, d, dtype, fill, q);
    decode_tensor(p_, rows, hkv, d, dtype, fill, k);
    decode_tensor(p_, rows, hkv, d, dtype, fill, v);
    decode_tensor(p_, rows, hq, d, dtype, backward ? fill : 0xa5, out);
    std::vector<float> lse(static_cast<size_t>(hq * rows), backward ? 0.5f : -7.0f), max_logit(static_cast<size_t>(hq), -7.0f);
    float* lse_arg = p_.u8() == 255 ? nullptr : lse.data();
    float* max_logit_arg = p_.u8() >= 128 ? nullptr : max_logit.data();
    if (backward) {
      decode_tensor(p_, rows, hq, d, dtype, fill, dout);
      decode_tensor(p_, rows, hq, d, plan_dtype_or(a.dq_dtype, dtype), 0xa5, dq);
      decode_tensor(p_, rows, hkv, d, plan_dtype_or(a.dkv_dtype, dtype), 0xa5, dk);
      decode_tensor(p_, rows, hkv, d, plan_dtype_or(a.dkv_dtype, dtype), 0xa5, dv);
    }
    for (const Tensor* t : {&q, &k, &v, &out, &dout, &dq, &dk, &dv}) {
      if (!t->ok) return;
    }
    Before before;
    thdcp_status_t status;
    if (!backward) {
      before.keep(out.memory);
      before.keep(lse);
      before.keep(max_logit);
      status = CALL(thdcp_attention_forward, slot.handle, &layout.c, q.get(), k.get(), v.get(), out.get(), lse_arg,
                    max_logit_arg, nullptr);
      if (status != THDCP_SUCCESS) {
        FUZZ_CHECK(before.same(0, out.memory) && before.same(1, lse) && before.same(2, max_logit),
                   "a refused forward wrote an output");
      }
    } else {
      before.keep(dq.memory);
      before.keep(dk.memory);
      before.keep(dv.memory);
      status = CALL(thdcp_attention_backward, slot.handle, &layout.c, q.get(), k.get(), v.get(), out.get(),
                    dout.get(), lse_arg, dq.get(), dk.get(), dv.get(), nullptr);
      if (status != THDCP_SUCCESS) {
        FUZZ_CHECK(before.same(0, dq.memory) && before.same(1, dk.memory) && before.same(2, dv.memory),
                   "a refused backward wrote an output");
      }
    }
    if (!slot.live && slot.handle != nullptr) expect(status, THDCP_ERROR_INVALID_HANDLE, "a run of a destroyed plan");
    if (slot.handle == nullptr) expect(status, THDCP_ERROR_INVALID_ARGUMENT, "a run of a NULL plan");
  }

  // ---- communicators ------------------------------------------------------------------

  void group_create() {
    std::vector<Slot<thdcp_communicator_t>>& group = groups_[p_.u8() % kGroups];
    const uint8_t b = p_.u8();
    const int size = b < 240 ? 1 + b % kMaxCollectiveRanks : p_.value_i32();
    // The array the call is told of: `size` handles when memory can hold them; for a size the
    // library must refuse before writing (beyond THDCP_MAX_GROUP_SIZE, or < 1), one.
    const bool backed = size >= 1 && size <= 2 * THDCP_MAX_GROUP_SIZE;
    std::vector<thdcp_communicator_t> comms(backed ? static_cast<size_t>(size) : 1,
                                            sentinel<thdcp_communicator_t>());
    const bool null_out = p_.u8() == 255;
    for (const auto& rank : group) {
      if (rank.live) expect(CALL(thdcp_communicator_destroy, rank.handle), THDCP_SUCCESS, "destroy a live rank");
    }
    group.clear();
    const thdcp_status_t status =
        CALL(thdcp_communicator_create_in_process_group, size, null_out ? nullptr : comms.data());
    if (status != THDCP_SUCCESS) {
      for (thdcp_communicator_t c : comms) FUZZ_CHECK(c == sentinel<thdcp_communicator_t>(), "a refused create wrote");
      return;
    }
    FUZZ_CHECK(size >= 1 && size <= THDCP_MAX_GROUP_SIZE && !null_out, "a group outside the limits was made");
    for (thdcp_communicator_t c : comms) {
      FUZZ_CHECK(c != nullptr && c != sentinel<thdcp_communicator_t>(), "every rank's handle is written");
      group.push_back({c, true});
    }
  }

  void communicator_destroy() {
    std::vector<Slot<thdcp_communicator_t>>& group = groups_[p_.u8() % kGroups];
    const uint8_t r = p_.u8();
    if (group.empty()) {
      expect(CALL(thdcp_communicator_destroy, nullptr), THDCP_SUCCESS, "destroy(NULL)");
      return;
    }
    Slot<thdcp_communicator_t>& rank = group[r % group.size()];
    expect(CALL(thdcp_communicator_destroy, rank.handle), expected_for(rank.handle, rank.live), "communicator destroy");
    rank.live = false;
  }

  void communicator_query() {
    const std::vector<Slot<thdcp_communicator_t>>& group = groups_[p_.u8() % kGroups];
    const uint8_t r = p_.u8(), which = p_.u8();
    const bool null_out = p_.u8() == 255;
    if (group.empty()) return;
    const size_t index = r % group.size();
    const Slot<thdcp_communicator_t>& rank = group[index];
    int value = -12345;
    const char* kind = nullptr;
    thdcp_status_t status;
    thdcp_graph_bank_t bank = sentinel<thdcp_graph_bank_t>();
    switch (which % 6) {
      case 5: {
        // Graph banks need CUDA: this build refuses them (UNSUPPORTED) after the handle check.
        const thdcp_graph_bank_params bank_params = THDCP_GRAPH_BANK_PARAMS_INIT;
        status = CALL(thdcp_graph_bank_create, rank.handle, &bank_params, null_out ? nullptr : &bank);
        FUZZ_CHECK(bank == sentinel<thdcp_graph_bank_t>(), "a refused bank create wrote the bank");
        if (rank.live) FUZZ_CHECK(status != THDCP_SUCCESS, "a graph bank without CUDA");
        break;
      }
      case 0: status = CALL(thdcp_communicator_rank, rank.handle, null_out ? nullptr : &value); break;
      case 1: status = CALL(thdcp_communicator_size, rank.handle, null_out ? nullptr : &value); break;
      case 2: status = CALL(thdcp_communicator_is_device, rank.handle, null_out ? nullptr : &value); break;
      case 3: status = CALL(thdcp_communicator_device, rank.handle, null_out ? nullptr : &value); break;
      default: status = CALL(thdcp_communicator_kind, rank.handle, null_out ? nullptr : &kind); break;
    }
    if (!rank.live) {
      expect(status, THDCP_ERROR_INVALID_HANDLE, "a query of a destroyed communicator");
      return;
    }
    if (which % 6 == 5) return;
    expect(status, null_out ? THDCP_ERROR_INVALID_ARGUMENT : THDCP_SUCCESS, "a query of a live communicator");
    if (null_out) return;
    const int expected[] = {static_cast<int>(index), static_cast<int>(group.size()), 0, -1};
    if (which % 6 < 4) FUZZ_CHECK(value == expected[which % 6], "rank, size, is_device, device of an in-process rank");
    if (which % 6 == 4) FUZZ_CHECK(kind != nullptr && std::strcmp(kind, "in-process") == 0, "kind in-process");
  }

  // ---- CP plans -----------------------------------------------------------------------

  thdcp_cp_params decode_cp_params(int group_size) {
    thdcp_cp_params v = THDCP_CP_PARAMS_INIT;
    v.backend = p_.value_backend();
    v.dtype = p_.value_dtype();
    v.max_tokens = p_.value_i64();
    v.q_heads = p_.value_i64();
    v.kv_heads = p_.value_i64();
    v.head_dim = p_.value_i64();
    const uint8_t cp = p_.u8();
    v.cp_size = cp < 240 ? group_size : p_.value_i32();
    v.max_seqs = p_.value_i32();
    v.window_left = p_.value_i32();
    v.window_right = p_.value_i32();
    v.softmax_scale = p_.value_float();
    v.deterministic = p_.u8();
    if (p_.flag()) {
      v.num_threads = p_.value_i32();
      v.backward_kv_from_forward = p_.u8();
      const uint8_t reserved = p_.u8();
      v.reserved_head_groups = reserved < 250 ? reserved % 2 : p_.value_i32();
      v.reserved = reserved == 255 ? p_.value_i32() : 0;
    }
    if (p_.flag()) {  // K/V gathers: the three values, or any int (refused); a2a_size (0, 1, or refused)
      const uint8_t gather = p_.u8();
      v.kv_gather = gather < 240 ? gather % 3 : p_.value_i32();
      const uint8_t groups = p_.u8();
      v.a2a_size = groups < 240 ? groups % 2 : p_.value_i32();
    }
    return v;
  }

  void cp_create() {
    CpSet& set = cp_[p_.u8() % kCpSets];
    const std::vector<Slot<thdcp_communicator_t>>& group = groups_[p_.u8() % kGroups];
    const int n = static_cast<int>(group.size());
    const thdcp_cp_params value = decode_cp_params(n);
    // Each rank's own struct; one rank's may differ in a field (every rank must then fail).
    const int odd_rank = p_.u8() % 8;
    const uint8_t odd_field = p_.u8();
    std::vector<thdcp_cp_params> values(static_cast<size_t>(std::max(n, 1)), value);
    if (odd_rank < n) {
      thdcp_cp_params& odd = values[static_cast<size_t>(odd_rank)];
      switch (odd_field % 8) {
        case 0: odd.max_tokens = odd.max_tokens == 48 ? 24 : 48; break;
        case 1: odd.head_dim = odd.head_dim == 8 ? 16 : 8; break;
        case 2: odd.window_left = odd.window_left == -1 ? 4 : -1; break;
        case 3: odd.dtype = raw_value(odd.dtype) == THDCP_DTYPE_FP32 ? THDCP_DTYPE_BF16 : THDCP_DTYPE_FP32; break;
        case 4: odd.softmax_scale = odd.softmax_scale == 0.5f ? 0.25f : 0.5f; break;
        default: break;
      }
    }
    std::vector<ParamsBuffer<thdcp_cp_params>> params;
    for (const thdcp_cp_params& v : values) params.emplace_back(p_, v, THDCP_CP_PARAMS_MIN_SIZE);
    const bool null_out = p_.u8() == 255;

    size_t workspace = 12345;
    const thdcp_status_t sized = CALL(thdcp_cp_plan_workspace_size, params[0].get(), &workspace);
    FUZZ_CHECK(sized == THDCP_SUCCESS ? workspace == 0 : workspace == 12345, "a CPU CP plan's workspace is 0 bytes");

    if (n == 0) {
      thdcp_cp_plan_t made = sentinel<thdcp_cp_plan_t>();
      expect(CALL(thdcp_cp_plan_create, nullptr, params[0].get(), nullptr, 0, &made), THDCP_ERROR_INVALID_ARGUMENT,
             "a CP plan over a NULL communicator");
      FUZZ_CHECK(made == sentinel<thdcp_cp_plan_t>(), "a refused create wrote the plan");
      return;
    }
    bool all_live = true;
    for (const auto& rank : group) all_live = all_live && rank.live;
    if (!all_live) {
      // Only the destroyed ranks call: a live rank would wait in the collective for ever.
      for (const auto& rank : group) {
        if (rank.live) continue;
        thdcp_cp_plan_t made = sentinel<thdcp_cp_plan_t>();
        expect(CALL(thdcp_cp_plan_create, rank.handle, params[0].get(), nullptr, 0, &made),
               THDCP_ERROR_INVALID_HANDLE, "a CP plan over a destroyed communicator");
        FUZZ_CHECK(made == sentinel<thdcp_cp_plan_t>(), "a refused create wrote the plan");
      }
      return;
    }
    if (n > kMaxCollectiveRanks) return;
    for (const thdcp_cp_params& v : values) {
      const auto size = [](int64_t x) { return static_cast<__int128>(std::clamp<int64_t>(x, 0, int64_t{1} << 40)); };
      const __int128 elements = size(v.max_tokens) * (size(v.q_heads) + size(v.kv_heads)) * size(v.head_dim);
      if (elements > kMaxCpPlanElements) return;  // a plan this large would allocate it
    }

    for (auto& rank : set.ranks) {
      if (rank.live) expect(CALL(thdcp_cp_plan_destroy, rank.handle), THDCP_SUCCESS, "destroy a live CP plan");
    }
    set.ranks.assign(static_cast<size_t>(n), {});
    std::vector<thdcp_cp_plan_t> made(static_cast<size_t>(n), sentinel<thdcp_cp_plan_t>());
    std::vector<thdcp_status_t> status(static_cast<size_t>(n));
    on_ranks(n, [&](int r) {
      const size_t i = static_cast<size_t>(r);
      status[i] = CALL(thdcp_cp_plan_create, group[i].handle, params[i].get(), nullptr, 0,
                       null_out && r == 0 ? nullptr : &made[i]);
    });
    int succeeded = 0;
    for (int r = 0; r < n; ++r) {
      const size_t i = static_cast<size_t>(r);
      if (status[i] == THDCP_SUCCESS) {
        ++succeeded;
        set.ranks[i] = {made[i], true};
      } else {
        FUZZ_CHECK(made[i] == sentinel<thdcp_cp_plan_t>(), "a refused CP create wrote the plan");
      }
    }
    FUZZ_CHECK(succeeded == 0 || succeeded == n, "a collective create succeeded on some ranks only");
    if (sized != THDCP_SUCCESS) FUZZ_CHECK(succeeded == 0, "create accepted params workspace_size refused");
    const thdcp_cp_params defaults = THDCP_CP_PARAMS_INIT;
    if (succeeded == n) set.params = as_read(value, params[0].get()->struct_size, defaults);
  }

  void cp_destroy() {
    CpSet& set = cp_[p_.u8() % kCpSets];
    const uint8_t r = p_.u8();
    if (set.ranks.empty()) return;
    Slot<thdcp_cp_plan_t>& rank = set.ranks[r % set.ranks.size()];
    expect(CALL(thdcp_cp_plan_destroy, rank.handle), expected_for(rank.handle, rank.live), "CP plan destroy");
    rank.live = false;
  }

  // A CP step on every rank of a set (each rank's tensors T/cp rows; one rank's may differ,
  // and that rank's failure must release the others), or on its destroyed plans alone.
  void cp_run(bool backward) {
    const CpSet& set = cp_[p_.u8() % kCpSets];
    const int n = static_cast<int>(set.ranks.size());
    if (n == 0) return;
    bool all_live = true;
    for (const auto& rank : set.ranks) all_live = all_live && rank.live;
    if (!all_live) {
      for (const auto& rank : set.ranks) {
        if (rank.live) continue;
        expect(backward ? CALL(thdcp_cp_backward, rank.handle, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                               nullptr, nullptr, nullptr, nullptr, nullptr)
                        : CALL(thdcp_cp_forward, rank.handle, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                               nullptr, nullptr),
               rank.handle == nullptr ? THDCP_ERROR_INVALID_ARGUMENT : THDCP_ERROR_INVALID_HANDLE,
               "a CP step of a destroyed (or never made) plan");
      }
      return;
    }
    const thdcp_cp_params& a = set.params;
    if (n > kMaxCollectiveRanks || !runnable(a.max_tokens, a.q_heads, a.kv_heads, a.head_dim, a.num_threads)) return;
    const int64_t local = a.max_tokens / n;
    Layout layout;
    decode_layout(p_, 2 * n, a.max_tokens, layout);
    struct Rank {
      Tensor q, k, v, out, dout, dq, dk, dv;
      std::vector<float> lse, max_logit;
      bool ok = true;
    };
    std::vector<Rank> ranks(static_cast<size_t>(n));
    for (Rank& r : ranks) {
      decode_tensor(p_, local, a.q_heads, a.head_dim, a.dtype, 0x3c, r.q);
      decode_tensor(p_, local, a.kv_heads, a.head_dim, a.dtype, 0x3c, r.k);
      decode_tensor(p_, local, a.kv_heads, a.head_dim, a.dtype, 0x3c, r.v);
      decode_tensor(p_, local, a.q_heads, a.head_dim, a.dtype, 0x3c, r.out);
      r.lse.assign(static_cast<size_t>(a.q_heads * local), 0.5f);
      r.max_logit.assign(static_cast<size_t>(a.q_heads), 0.0f);
      if (backward) {
        decode_tensor(p_, local, a.q_heads, a.head_dim, a.dtype, 0x3c, r.dout);
        decode_tensor(p_, local, a.q_heads, a.head_dim, a.dtype, 0, r.dq);
        decode_tensor(p_, local, a.kv_heads, a.head_dim, a.dtype, 0, r.dk);
        decode_tensor(p_, local, a.kv_heads, a.head_dim, a.dtype, 0, r.dv);
      }
      for (const Tensor* t : {&r.q, &r.k, &r.v, &r.out, &r.dout, &r.dq, &r.dk, &r.dv}) {
        if (!t->ok) return;
      }
    }
    on_ranks(n, [&](int i) {
      Rank& r = ranks[static_cast<size_t>(i)];
      const thdcp_cp_plan_t plan = set.ranks[static_cast<size_t>(i)].handle;
      if (backward) {
        CALL(thdcp_cp_backward, plan, &layout.c, r.q.get(), r.k.get(), r.v.get(), r.out.get(), r.dout.get(),
             r.lse.data(), r.dq.get(), r.dk.get(), r.dv.get(), nullptr);
      } else {
        CALL(thdcp_cp_forward, plan, &layout.c, r.q.get(), r.k.get(), r.v.get(), r.out.get(), r.lse.data(),
             r.max_logit.data(), nullptr);
      }
    });
  }

  // A handle the library never returned (a small number, the address of a stack or heap
  // object), or a live handle of another kind: INVALID_HANDLE, and nothing is released (the
  // live one's destroy at the end must still succeed).
  void foreign_handle() {
    const uint8_t kind = p_.u8() % 4, source = p_.u8() % 4, use = p_.u8(), pick = p_.u8();
    int on_stack = 0;
    uintptr_t value = 1 + p_.u8();
    if (source == 1) value = reinterpret_cast<uintptr_t>(&on_stack);
    if (source == 2) value = reinterpret_cast<uintptr_t>(this);
    if (source == 3) {
      std::vector<uintptr_t> others;  // live handles of the other kinds
      for (const AttentionSlot& slot : attention_) {
        if (slot.live && kind != 0) others.push_back(reinterpret_cast<uintptr_t>(slot.handle));
      }
      for (const auto& group : groups_) {
        for (const auto& rank : group) {
          if (rank.live && kind != 1) others.push_back(reinterpret_cast<uintptr_t>(rank.handle));
        }
      }
      for (const CpSet& set : cp_) {
        for (const auto& rank : set.ranks) {
          if (rank.live && kind != 2) others.push_back(reinterpret_cast<uintptr_t>(rank.handle));
        }
      }
      if (!others.empty()) value = others[pick % others.size()];
    }
    thdcp_status_t status;
    switch (kind * 2 + use % 2) {
      case 0: status = CALL(thdcp_attention_plan_destroy, reinterpret_cast<thdcp_attention_plan_t>(value)); break;
      case 1:
        status = CALL(thdcp_attention_forward, reinterpret_cast<thdcp_attention_plan_t>(value), nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
        break;
      case 2: status = CALL(thdcp_communicator_destroy, reinterpret_cast<thdcp_communicator_t>(value)); break;
      case 3: {
        // Refused for its handle before it is collective: no rank waits for this one.
        thdcp_cp_plan_t made = sentinel<thdcp_cp_plan_t>();
        status = CALL(thdcp_cp_plan_create, reinterpret_cast<thdcp_communicator_t>(value), nullptr, nullptr, 0, &made);
        FUZZ_CHECK(made == sentinel<thdcp_cp_plan_t>(), "a refused create wrote the plan");
        break;
      }
      case 4: status = CALL(thdcp_cp_plan_destroy, reinterpret_cast<thdcp_cp_plan_t>(value)); break;
      case 5:
        status = CALL(thdcp_cp_forward, reinterpret_cast<thdcp_cp_plan_t>(value), nullptr, nullptr, nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr);
        break;
      case 6: status = CALL(thdcp_graph_bank_destroy, reinterpret_cast<thdcp_graph_bank_t>(value)); break;
      default: {
        size_t bytes = 12345;
        status = CALL(thdcp_graph_bank_device_bytes, reinterpret_cast<thdcp_graph_bank_t>(value), &bytes);
        FUZZ_CHECK(bytes == 12345, "a refused query wrote its output");
        break;
      }
    }
    expect(status, THDCP_ERROR_INVALID_HANDLE, "a foreign or wrong-kind handle");
  }

  void destroy_all() {
    for (CpSet& set : cp_) {
      for (auto& rank : set.ranks) {
        if (rank.live) expect(CALL(thdcp_cp_plan_destroy, rank.handle), THDCP_SUCCESS, "destroy a live CP plan");
      }
    }
    for (AttentionSlot& slot : attention_) {
      if (slot.live) expect(CALL(thdcp_attention_plan_destroy, slot.handle), THDCP_SUCCESS, "destroy a live plan");
    }
    for (auto& group : groups_) {
      for (auto& rank : group) {
        if (rank.live) expect(CALL(thdcp_communicator_destroy, rank.handle), THDCP_SUCCESS, "destroy a live rank");
      }
    }
  }

  Program& p_;
  AttentionSlot attention_[kAttentionSlots];
  std::vector<Slot<thdcp_communicator_t>> groups_[kGroups];
  CpSet cp_[kCpSets];
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Program program(data, size);
  Harness harness(program);
  for (int op = 0; op < 64 && !program.done(); ++op) harness.step();
  return 0;
}
