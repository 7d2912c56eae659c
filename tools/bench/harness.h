// The bench harness: what every mode of `thdcp bench` (plain, --cp, --scaling, --graph)
// shares, as nccl-tests' common.cu serves the small file of each collective. The GPU check
// and the device line, one timing loop (CUDA events, warm-up, median), one way to draw random
// inputs, the verification lines, one table printer. Streams and events are
// step/cuda_handles.h's, the step's tensors step/device_step.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/progress.h"
#include "step/cuda_handles.h"
#include "step/device_step.h"
#include "thdcp/core/tensor.h"
#include "thdcp/testing/compare.h"

namespace thdcp::tools {

// ---- the GPU --------------------------------------------------------------------------

// Throws UsageError (exit 2) when no CUDA device can be used, saying why:
// "<what> times CUDA kernels and needs a GPU: no CUDA device (...)".
void require_gpu(const char* what);

// The properties of `device`, and "<name> (<n> SMs, sm_<major><minor>)" of it (with_memory adds
// ", <total> GiB").
cudaDeviceProp device_properties(int device);
std::string device_text(int device, bool with_memory = false);

// Milliseconds from `start` to `stop` (both recorded and complete).
float elapsed_ms(const Event& start, const Event& stop);

// ---- the problem ----------------------------------------------------------------------------

class Args;

// The shape flags of the modes that take them: --q-heads (32), --kv-heads (8; dividing
// --q-heads), --head-dim (128), --v-head-dim (default --head-dim; only where the mode's Args
// accept it), --dtype (bf16 or fp16). What the CUDA kernels do not take is refused with
// UsageError (exit 2) naming the flag and its value.
StepShape parse_bench_shape(const Args& args);

// FLOPs of each pass per allowed (query, key) pair and query head (STYLE.md, Benchmarks): the
// matrix products, forward 2 * (D_qk + D_v) (S = QK^T, O = PV), backward 2 * (3 D_qk + 2 D_v)
// (S again, dP, dV, dQ, dK); 4 D and 10 D where D_qk = D_v = D.
struct PassFlops {
  double forward = 0, backward = 0;
  double forward_backward() const { return forward + backward; }
};
PassFlops pass_flops(const HeadShape& heads);

// ---- timing -----------------------------------------------------------------------------
// (median() of io/progress.h gives the median of the runs.)

// The timing loop of every mode. `warmup` untimed runs, then `iters` timed ones; every run
// is `before()`, a start event on the stream, `body()`, a stop event, `wait()`.
struct TimingLoop {
  int warmup = 0;
  int iters = 1;
  // Before every run, warm-up included: e.g. a host barrier, so that ranks start together.
  std::function<void()> before;
  // Until the run is done; empty: the stop event's completion. A CP rank passes its
  // communicator's synchronize, which surfaces a failed peer instead of waiting for it.
  std::function<void()> wait;
};

// The milliseconds of each timed run of `body` (CUDA events on `stream`).
std::vector<double> time_runs(const TimingLoop& loop, cudaStream_t stream, const std::function<void()>& body);

// The median of time_runs with no hooks: what one run of `body` takes on the device.
double time_median_ms(int warmup, int iters, cudaStream_t stream, const std::function<void()>& body);

// ---- inputs -----------------------------------------------------------------------------

// Random inputs are N(0,1) values (fill_normal of the seed) in a block of `block` elements,
// drawn once and repeated over the tensor: timing and the checks against a reference need
// values that are not zeros, not independent ones, and drawing 2^31 normals takes minutes.
// The default block has an odd length, so that the repetition does not line up with rows.
constexpr int64_t kRandomBlock = (int64_t{1} << 22) + 13;

void fill_random(HostTensor& tensor, uint64_t seed, int64_t block = kRandomBlock);
// `numel` elements of `dtype` at `device`; complete when it returns.
void fill_random(void* device, DType dtype, int64_t numel, uint64_t seed, int64_t block, cudaStream_t stream);
// A step's inputs q, k, v, dout from seeds seed + 1, ..., seed + 4, or all from `seed` when
// `one_seed`.
void fill_inputs(DeviceTensors& tensors, uint64_t seed, int64_t block, cudaStream_t stream, bool one_seed = false);

// ---- verification -----------------------------------------------------------------------

// got against ref, element by element.
Comparison compare(const HostTensor& got, const HostTensor& ref, const Tolerance& tolerance);
Comparison compare(const std::vector<float>& got, const std::vector<float>& ref, const Tolerance& tolerance);

// How a verification line gives the errors.
enum class ErrorFormat {
  kSummary,     // Comparison::summary()
  kScientific,  // "max abs err %.3e, max rel err %.3e, M/N outside tolerance"
};

// The verification of one configuration: a line "verify <what> <tensor> <errors>" per
// checked tensor, and whether every one passed (STYLE.md: verify first, then time).
class Verification {
 public:
  // `what` names the configuration as it is printed; `tensor_width` pads the tensor's name.
  Verification(std::string what, int tensor_width, ErrorFormat errors = ErrorFormat::kSummary);

  // Prints the tensor's line; returns whether it passed.
  bool check(const std::string& tensor, const Comparison& comparison);
  bool passed() const { return passed_; }

 private:
  std::string what_;
  int tensor_width_;
  ErrorFormat format_;
  bool passed_ = true;
};

// ---- tables -----------------------------------------------------------------------------

// printf into a string.
std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));

// One table printer for the modes' tables: aligned columns separated by a space, or markdown.
class Table {
 public:
  enum class Style { kAligned, kMarkdown };
  struct Column {
    std::string header;
    int width = 0;      // kAligned: the cells are padded to it (a longer cell is kept whole)
    bool left = false;  // aligned left (names), else right (numbers)
  };

  Table(Style style, std::vector<Column> columns);

  // The header line (and, in markdown, the alignment line under it).
  void print_header() const;
  // One line of cells, one per column.
  void print_row(const std::vector<std::string>& cells) const;

 private:
  std::string line(const std::vector<std::string>& cells) const;

  Style style_;
  std::vector<Column> columns_;
};

}  // namespace thdcp::tools
