// sched/profile_priorities.h — the priority of every layer's gradient of a model profile under
// each priority mode (index, auto, TicTac's tic/tac, PACE): what gradlane-sim schedules with and
// what gradlane-replay registers with the daemon, so a simulated and a replayed run of the same
// mode give the tensors the same priorities.
//
// Guarantees: pure, deterministic, no I/O.
#ifndef GRADLANE_SCHED_PROFILE_PRIORITIES_H_
#define GRADLANE_SCHED_PROFILE_PRIORITIES_H_

#include <vector>

#include "absl/status/statusor.h"
#include "sched/model_profile.h"
#include "sched/priority.h"
#include "sched/types.h"

namespace gradlane::sched {

// One priority per layer of `profile` (0 = most urgent); layers without parameters keep their
// index. kIndex: empty (the caller uses the layer index). kAuto: what the daemon learns from
// the first iteration, the profile's ready order (ties: later layers first, as backward posts
// them). DAG modes use the profile's layer chain (sched/dag.h BuildChainDag); `link_bytes_per_s`
// is TAC's time oracle for a transfer.
absl::StatusOr<std::vector<Priority>> ProfileLayerPriorities(const ModelProfile& profile,
                                                             PriorityMode mode,
                                                             double link_bytes_per_s);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_PROFILE_PRIORITIES_H_
