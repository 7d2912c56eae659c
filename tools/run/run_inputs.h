// Where the batch of `thdcp run` comes from (built-in workload, a lengths file, or .npy files
// from --load), and how outputs go back to the user's layout and to --save.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/npy.h"
#include "run/run_job.h"

namespace thdcp::tools {

// The built-in workload: lognormal document lengths filling config.tokens rows.
GlobalBatch make_default_batch(const RunConfig& config);

// Documents of batch config.batch_index of config.lengths_file, packed in order into batches
// of config.tokens rows (each document padded to a multiple of 2*cp); random tensors.
GlobalBatch make_batch_from_lengths(const RunConfig& config);

// --load DIR, in steps, so that memory is checked before anything large is read:
//   LoadFiles files = read_load_headers(config, ...);  // headers only; fills the config's shape
//   check_host_memory(config, load_size(files), ...);  // rows and sequences the headers promise
//   GlobalBatch batch = load_layout(config, files);     // the offsets: layouts, lengths, row map
//   check_host_memory(config, load_size(files, batch), ...);  // the job's rows, exactly
//   load_tensors(config, files, batch);                 // q, k, v and dout, one at a time
// The files: q.npy, k.npy, v.npy, cu_seqlens.npy and optionally cu_seqlens_padded.npy,
// dout.npy, their headers read and checked (shapes, dtypes, sizes against the files).
struct LoadFiles {
  NpyHeader q, k, v, cu;
  std::optional<NpyHeader> cu_padded, dout;
};

// The headers of config.load_dir's files, checked against each other. Fills config's heads,
// head_dim and dtype from them (a flag that disagrees with them is an error).
LoadFiles read_load_headers(RunConfig& config, bool dtype_given, bool heads_given, bool head_dim_given);

// The run's sizes from the headers alone (the job's rows may grow when re-padded for cp), and
// with the layout read, exactly.
RunSize load_size(const LoadFiles& files);
RunSize load_size(const LoadFiles& files, const GlobalBatch& batch);

// Reads the offsets: the user's layout, the lengths and, when the layout is not aligned to
// 2*cp, the job's re-padded layout with GlobalBatch::user_rows mapping it back. No tensors.
GlobalBatch load_layout(const RunConfig& config, const LoadFiles& files);

// Reads q, k, v and dout (N(0,1) values when there is no dout.npy) into batch's tensors in the
// job's layout; unless config.allow_nonfinite, refuses non-finite values in valid rows and
// values whose dot products can overflow fp32.
void load_tensors(RunConfig& config, const LoadFiles& files, GlobalBatch& batch);

// A [T, H, D] tensor of the job's layout in the user's layout (padding rows of the user's
// layout are 0), and the same for lse ([H, T]).
HostTensor to_user_layout(const GlobalBatch& batch, const HostTensor& tensor);
std::vector<float> lse_to_user_layout(const GlobalBatch& batch, const std::vector<float>& lse, int64_t heads);

// Writes the inputs and outputs as .npy files into `dir` (created if missing), in the user's
// layout: q, k, v, dout, cu_seqlens, cu_seqlens_padded, out, lse, max_logit, dq, dk, dv.
void save_run(const std::string& dir, const GlobalBatch& batch, const GlobalOutputs& outputs);

// The files save_run writes (q.npy, ..., max_logit.npy).
const std::vector<std::string>& saved_file_names();

}  // namespace thdcp::tools
