// sched/priority.h — where tensor priorities come from (docs/design.md §4 "priorities"):
//
//   index  the priority each tensor was registered with (by convention its forward index, the
//          order the next forward pass consumes parameters in; P3, ByteScheduler);
//   auto   learned: the first iteration's gradient-ready order, reversed (backward produces
//          gradients last-layer-first, so the reversed ready order is the forward order);
//   tic    TicTac TIC from a DAG (structure only);
//   tac    TicTac TAC from a DAG and a time oracle (compute durations + link bandwidth);
//   pace   PACE: larger L_i (longer computation waiting on the tensor) first, which makes a
//          preemptive priority queue run Horn's rule (sched/pace.h).
//
// Guarantees: pure functions except AutoPriority, which holds its observations; no I/O, no
// clock. Priority 0 is the most urgent. AutoPriority is not thread-safe (one owner thread).
#ifndef GRADLANE_SCHED_PRIORITY_H_
#define GRADLANE_SCHED_PRIORITY_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/dag.h"
#include "sched/pace.h"
#include "sched/types.h"

namespace gradlane::sched {

enum class PriorityMode : uint8_t { kIndex, kAuto, kTic, kTac, kPace };

// "index" | "auto" | "tic" | "tac" | "pace" (exact, lower case).
absl::StatusOr<PriorityMode> ParsePriorityMode(std::string_view name);
std::string_view PriorityModeName(PriorityMode mode);
// Whether the mode needs a Dag (tic, tac, pace).
bool PriorityModeNeedsDag(PriorityMode mode);

// Learns `auto` priorities online. Feed it the ready events of gradients (tensor id, iteration);
// the first iteration it sees is the one it learns from. The order is frozen as soon as an event
// of a later iteration arrives, or on Freeze(). From then on priorities never change:
//   - tensors seen in the learning iteration: that ready order reversed (last ready = 0);
//   - tensors registered but never seen: after those, in registration order;
//   - tensors first met later (registered or observed after freezing): appended, in that order.
// Before freezing, PriorityOf answers the provisional order: registration order.
class AutoPriority {
 public:
  // Declares a tensor (in registration order). Registering twice is a no-op.
  void Register(uint32_t tensor_id);
  // A gradient of `tensor_id` for `iteration` became ready. Repeats within the learning
  // iteration count once (the first time); unknown tensors are registered on the fly.
  void Observe(uint32_t tensor_id, int64_t iteration);
  // Ends learning now (e.g. at the end of the first iteration). Idempotent.
  void Freeze();

  bool frozen() const { return frozen_; }
  // The tensor's priority; tensors never registered nor observed get the next number after all
  // known ones (without being recorded).
  Priority PriorityOf(uint32_t tensor_id) const;

 private:
  Priority Append(uint32_t tensor_id);

  bool frozen_ = false;
  bool learning_started_ = false;
  int64_t learning_iteration_ = 0;
  std::vector<uint32_t> registered_;                     // registration order
  std::vector<uint32_t> ready_order_;                    // learning iteration's first-ready order
  absl::flat_hash_map<uint32_t, Priority> provisional_;  // registration index
  absl::flat_hash_map<uint32_t, bool> seen_;
  absl::flat_hash_map<uint32_t, Priority> learned_;
  Priority next_ = 0;  // next free priority number after freezing
};

struct PriorityOptions {
  // TAC's time oracle for recv ops: bytes over this link bandwidth (bytes/s).
  double link_bytes_per_s = 1.25e9;
  // PACE's all-reduce cost model, for the schedule PlanPace computes alongside; the priorities
  // themselves depend only on L_i and release times, which come from the DAG alone.
  AllReduceCost allreduce_cost{0, 1e9 / 1.25e9};
  // For kAuto: the learner to read; without one, kAuto answers the provisional order
  // (registration order = position in `tensors`).
  const AutoPriority* auto_learner = nullptr;
};

// Priorities for `tensors`, one per entry, in the same order. DAG modes match each
// TensorSpec::id to the Dag tensor with that id and fail (InvalidArgument) for an id the DAG does
// not have, or when `dag` is null. kIndex fails on a negative registered priority.
absl::StatusOr<std::vector<Priority>> AssignPriorities(PriorityMode mode,
                                                       absl::Span<const TensorSpec> tensors,
                                                       const Dag* dag,
                                                       const PriorityOptions& options = {});

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_PRIORITY_H_
