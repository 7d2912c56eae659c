// Support for CP tests: one rank's AllGather CP forward+backward, compared with the
// single-device reference rows that rank owns. Used by the in-process and the MPI tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/outputs.h"
#include "support/random_batch.h"
#include "support/shape.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::test {

// The problem of a CP plan of `cp` ranks at `capacity` for shape `s`.
cp::Problem cp_problem(int cp, const Capacity& capacity, const Shape& s);

// The CPU reference forward and backward of the whole batch (one segment per sequence).
Outputs single_device(const Batch& b, const Mask& mask, const AttentionOptions& options);

// The same with attention sinks [Hq] (empty: none); d(sink) into `dsinks` (resized to [Hq]).
Outputs single_device(const Batch& b, const Mask& mask, const AttentionOptions& options,
                      const std::vector<float>& sinks, std::vector<float>& dsinks);

// The rows of `global` that rank `rank` of `cp` holds under `cp_layout` (split_for_rank).
HostTensor local_part(const HostTensor& global, const LayoutView& layout, int cp, int rank,
                      CpLayout cp_layout = CpLayout::kDualChunk);

// The same for lse [heads, rows]: each head's plane split on its own.
std::vector<float> local_lse(const std::vector<float>& global, int64_t heads, const LayoutView& layout, int cp,
                             int rank, CpLayout cp_layout = CpLayout::kDualChunk);

// The rows of every output of `global` that `rank` holds (lse plane by plane; max_logit,
// max-reduced over the group, whole).
Outputs local_outputs(const Outputs& global, const LayoutView& layout, int cp, int rank,
                      CpLayout cp_layout = CpLayout::kDualChunk);

// Runs CP forward and backward on this rank and compares every output with the rows of
// `reference` the rank owns. Outputs are poisoned with NaN first.
::testing::AssertionResult check_cp_rank(Communicator& comm, const Batch& b, const Mask& mask,
                                         const Outputs& reference, const AttentionOptions& options);

// The same through a CpuPlan of `problem` (any layout and comm; its mask and shapes those of
// `b`), with attention sinks when `sinks` is not empty: d(sink) into `dsinks`, compared with
// `reference_dsinks`.
::testing::AssertionResult check_cp_plan_rank(Communicator& comm, const Batch& b, const cp::Problem& problem,
                                              const Outputs& reference, const AttentionOptions& options,
                                              const std::vector<float>& sinks = {},
                                              const std::vector<float>& reference_dsinks = {},
                                              std::vector<float>* dsinks = nullptr);

// The ranks' outputs of a CP run whose reduce-scatter ran in the storage dtype (`rounded`,
// cp::Problem::reduce_dtype) against the fp32 reduce-scatter's run (`exact`) and the
// single-device `reference`: out, lse, max_logit and dq the same bits; dk and dv within
// `grads` of the reference's rows under `layout`. Returns whether dk or dv differ from the
// fp32 run's anywhere (the option acted).
bool expect_reduced_gradients(const std::vector<Outputs>& rounded, const std::vector<Outputs>& exact,
                              const Outputs& reference, const Batch& b, CpLayout layout, const Tolerance& grads);

// This rank's outputs (its local rows) of a CpuPlan of `problem` on `b`, forward then
// backward, with `sinks` (empty: none; d(sink) into `dsinks` when given).
Outputs cp_plan_rank_outputs(Communicator& comm, const Batch& b, const cp::Problem& problem,
                             const AttentionOptions& options, const std::vector<float>& sinks = {},
                             std::vector<float>* dsinks = nullptr);

// Every rank of an in-process group of problem.cp ranks runs a CpuPlan of `problem` on `b`
// (check_cp_plan_rank, one thread per rank's attention) against the single-device result,
// with `sinks` (empty: none); every rank's dsinks the same bits.
void expect_cp_plan_matches_single_device(const Batch& b, const Mask& mask, const cp::Problem& problem,
                                          const std::vector<float>& sinks);

// A CpuPlan of `problem` made on every rank of an in-process group (rank 1 plans `other`):
// the message each rank's plan threw, or "" where it did not.
std::vector<std::string> plan_messages(const cp::Problem& problem, const cp::Problem& other);

// Every rank's message contains `wanted` (a refusal seen on every rank, none left waiting).
void expect_every_rank_says(const std::vector<std::string>& messages, const std::string& wanted);

}  // namespace thdcp::test
