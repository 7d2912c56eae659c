// The checks of a CP plan and its steps, shared by both step sets. The cross-rank check of
// a plan (DESIGN.md section 5): every rank validates its own
// arguments, the ranks exchange the outcome together with the problem they planned, and all
// of them throw the same thdcp::Error when one failed or the problems differ. It runs once,
// when a plan is made; a step moves no descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "thdcp/cp/cp.h"
#include "thdcp/plan/layout.h"

namespace thdcp::cp::detail {

// Checks a problem on its own: cp, capacity, mask, heads. Backend limits (dtype, head dim)
// are the step sets' own checks. Throws thdcp::Error.
void validate_problem(const Problem& problem);

// What every step checks against its plan, on either backend, with host arithmetic only:
// every tensor is this rank's [T/cp, heads, D] in the problem's dtype (gradients: or fp32)
// with strides >= 0, the outputs overlap neither themselves nor another tensor of the step
// (thdcp/core/overlap.h), and lse is given. Throws thdcp::Error naming the tensor.
void check_forward_tensors(const Problem& problem, const ForwardTensors& tensors);
void check_backward_tensors(const Problem& problem, const BackwardTensors& tensors);

// a2a+ag's AllGather CP across the groups (either backend): ag_size = cp / a2a_size ranks,
// each group member's share of the heads (q_heads and kv_heads / a2a_size), comm all_gather;
// the problem's layout, mask, capacity and kv_gather.
Problem a2a_ag_across(const Problem& problem);

// FNV-1a over both offset arrays: one-shot calls also agree on their layout.
uint64_t layout_fingerprint(const LayoutView& layout);

// Moves `bytes` from every rank into `recv`, rank-major (a host or device all-gather).
using ExchangeBytes = std::function<void(const void* send, void* recv, size_t bytes)>;

struct AgreementInput {
  Problem problem;
  int rank = 0;
  int size = 1;
  uint64_t options_fingerprint = 0;  // backend options every rank must share (scale, determinism)
  uint64_t layout_fingerprint = 0;   // one-shot calls: the batch's layout; 0 otherwise
  int64_t local_rows[3] = {};        // one-shot calls: rows of q, k, v as passed
};

// Runs `local_checks` (and validate_problem) on this rank, exchanges the outcome and the
// problem, and throws on every rank if any rank failed or any differs from rank 0.
void agree(const AgreementInput& input, const std::function<void()>& local_checks, const ExchangeBytes& exchange);

}  // namespace thdcp::cp::detail
