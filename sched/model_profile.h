// sched/model_profile.h — a DNN model's per-layer profile (parameter bytes, forward and backward
// compute time, gradient ready times): the input of the simulator and the replay benchmark.
//
// The text format is the one in docs/design.md §5 (tests/data/models/*.json):
//   { "model": "resnet50", "batch_size": 32, "reference": "...",
//     "layers": [ {"name": "conv1", "param_bytes": 37632, "fwd_us": 410, "bwd_us": 820,
//                  "ready_us": 97000}, ... ] }
// Layers are in forward order; a layer's index is its default priority (0 = most urgent).
//
// Guarantees: parsing never throws and never aborts; every malformed input (bad JSON, a missing
// or mistyped field, a negative or non-integral size, an empty layer list, ready_us on some layers
// but not all) is an InvalidArgument error naming the field and the layer. Fields the format
// does not define are ignored, so any file of this form runs unchanged. No I/O: the caller reads
// the file. Times are converted to integer nanoseconds (rounded to nearest) once, here.
#ifndef GRADLANE_SCHED_MODEL_PROFILE_H_
#define GRADLANE_SCHED_MODEL_PROFILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/types.h"

namespace gradlane::sched {

struct ModelLayer {
  std::string name;
  uint64_t param_bytes = 0;
  TimeNs fwd_ns = 0;
  TimeNs bwd_ns = 0;
  // When this layer's gradient is ready, measured from the start of backward. Always filled:
  // taken from the file's ready_us, or derived as the cumulative bwd time from the last layer
  // down to this one (the strict reverse order a CPU framework releases gradients in).
  TimeNs ready_ns = 0;
};

struct ModelProfile {
  std::string model;
  int64_t batch_size = 0;  // 0 when the file does not say
  std::string reference;
  std::vector<ModelLayer> layers;
  // True when ready times came from the file (e.g. a stepwise GPU release), false if derived.
  bool explicit_ready_times = false;

  // Sum of every layer's fwd time.
  TimeNs ForwardNs() const;
  // The backward pass's length: the sum of bwd times, or the last gradient's ready time if the
  // file's ready_us run past that sum (the GPU is busy until its last gradient is out).
  TimeNs BackwardNs() const;
  // Forward plus backward: the iteration time with communication for free.
  TimeNs ComputeNs() const { return ForwardNs() + BackwardNs(); }
  // Sum of param_bytes: the bytes of one full gradient (and of one full model).
  uint64_t TotalParamBytes() const;
};

// Parses a profile from JSON text. See the header comment for the errors.
absl::StatusOr<ModelProfile> ParseModelProfile(std::string_view json_text);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_MODEL_PROFILE_H_
