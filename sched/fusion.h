// sched/fusion.h — PACE §V, Alg. 1: balanced all-reduce tensor fusion.
//
// Small tensors waste the link on per-operation overhead; fusing them delays the fused tensor to
// the latest member's ready time. PACE orders the tensors by ready time into a chain (Lemma 2:
// fusing neighbours on that chain delays least), and for each group count R partitions the
// chain into R contiguous groups maximising the smallest group's total size (MaxMinSize, a
// max-min dynamic programme). Each candidate fused DAG is scored with the optimal preemptive
// schedule of sched/pace.h, and the R with the shortest iteration wins (ties: the smaller R, as
// Alg. 1's strict "<" keeps the first).
//
// A fused tensor is released when its last member is (Alg. 1 line 5: "the one with the latest
// completion time among precedent computation operators"), takes g(sum of sizes), and every
// computation waiting for any member waits for it, so its L is the members' largest L.
//
// Guarantees: pure, deterministic, no I/O, no clock. One DP table serves every R: O(n²·R) time
// and O(n·R) memory for R groups at most; each candidate's schedule costs O(R²).
#ifndef GRADLANE_SCHED_FUSION_H_
#define GRADLANE_SCHED_FUSION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/dag.h"
#include "sched/pace.h"

namespace gradlane::sched {

struct ChainPartition {
  uint64_t min_group_bytes = 0;    // the maximised minimum group size
  std::vector<int32_t> group_end;  // exclusive end index of each group along the chain
};

// MaxMinSize(N, R) over `sizes` (the chain, in order): R contiguous non-empty groups whose
// smallest total is as large as possible. Ties go to the shortest first group, as the paper's
// shortest-prefix-first enumeration with strict improvement does. Error if R < 1 or
// R > sizes.size(), or if the sizes sum past 2^63.
absl::StatusOr<ChainPartition> MaxMinPartition(absl::Span<const uint64_t> sizes, int groups);

struct FusionPlan {
  int groups = 0;                             // R*
  std::vector<std::vector<int32_t>> members;  // per fused tensor: job indices, chain order
  PaceInstance fused;  // one job per fused tensor; fused.tensor holds its first member's tensor
  PreemptiveSchedule schedule;  // Horn's rule on `fused`
  TimeNs iteration_time = 0;    // max(objective, compute floor)
};

// Alg. 1 on an unfused instance (from BuildPaceInstance): tries R = 1..max_groups (0: all, up
// to the number of jobs). `members` refer to indices of `unfused.jobs`. Error on an empty
// instance or a negative cost.
absl::StatusOr<FusionPlan> BalancedFusion(const PaceInstance& unfused, const AllReduceCost& cost,
                                          int max_groups = 0);

// Alg. 1 on a DAG: BuildPaceInstance then BalancedFusion.
absl::StatusOr<FusionPlan> BalancedFusion(const Dag& dag, const AllReduceCost& cost,
                                          int max_groups = 0);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_FUSION_H_
