// Where the batch of `thdcp run` comes from (built-in workload, a lengths file, or .npy files
// from --load), and how outputs go back to the user's layout and to --save.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "run/run_job.h"

namespace thdcp::tools {

// The built-in workload: lognormal document lengths filling config.tokens rows.
GlobalBatch make_default_batch(const RunConfig& config);

// Documents of batch config.batch_index of config.lengths_file, packed in order into batches
// of config.tokens rows (each document padded to a multiple of 2*cp); random tensors.
GlobalBatch make_batch_from_lengths(const RunConfig& config);

// q.npy, k.npy, v.npy, cu_seqlens.npy and optionally cu_seqlens_padded.npy, dout.npy from
// config.load_dir. Fills config's heads, head_dim and dtype from the files (a flag that
// disagrees with them is an error). When the loaded layout is not aligned to 2*cp the batch is
// re-laid out with padded lengths, and GlobalBatch::user_rows maps it back.
GlobalBatch load_batch(RunConfig& config, bool dtype_given, bool heads_given, bool head_dim_given);

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
