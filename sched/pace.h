// sched/pace.h — PACE §IV (Bao et al., INFOCOM'20): preemptive scheduling of all-reduce
// tensors on one link, so that the next iteration's computation finishes as early as possible.
//
// PACE reduces its objective (Theorem 1) to  min max_i (y_i + L_i)  where y_i is when tensor i's
// all-reduce completes and L_i the longest computation path that waits for it. Tensor i may
// start only after its gradient is ready (release r_i, constraint (7)) and the link runs one
// tensor at a time, preemptibly (constraint (6)). That is the classic 1|r_j,pmtn|Lmax problem
// with due dates d_i = −L_i, which preemptive earliest-due-date (Horn's rule) solves exactly:
// always run the released, unfinished tensor with the largest L_i. We use that rule instead of
// the paper's LP relaxation; tests/unit/sched/pace_test.cc checks it against brute force.
//
// Timeline (our reading of PACE's DAG, which spans backward → all-reduce → next forward, on a
// worker DAG whose recvs are roots and sends leaves): time 0 is the start of this iteration with
// its parameters in place (recvs done at 0); r_i is when tensor i's send op becomes ready with
// unlimited compute devices (PACE's "ideal computation", constraint (5)); the all-reduce of i
// completes at y_i and releases tensor i's recv for the next iteration; L_i is the longest path
// of compute durations from the recv's successors to a sink. A tensor without a send op is
// released at 0; one without a recv op has L_i = 0.
//
// Guarantees: pure, deterministic (ties by tensor index), no I/O, no clock; O(n²) in tensors.
#ifndef GRADLANE_SCHED_PACE_H_
#define GRADLANE_SCHED_PACE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/dag.h"
#include "sched/types.h"

namespace gradlane::sched {

// All-reduce time as a function of tensor size: g(S) = fixed + S · ns_per_byte, rounded up.
// PACE fits exactly this linear model to profiled (size, time) points (§IV-A, after Eq. 1); the
// fixed part is the per-operation overhead that makes tensor fusion pay (§II-C).
struct AllReduceCost {
  TimeNs fixed = 0;
  double ns_per_byte = 0;
  TimeNs Time(uint64_t bytes) const;
};

// Eq. 1 for ring all-reduce among `workers`: g = (S/W)·2(W−1)/B + (S/W)(W−1)/G, with B the link
// bandwidth and G the aggregation rate, both in bytes/s, plus `fixed`. Error on W < 1 or
// non-positive rates.
absl::StatusOr<AllReduceCost> RingAllReduceCost(int workers, double link_bytes_per_s,
                                                double reduce_bytes_per_s, TimeNs fixed = 0);

// One all-reduce tensor of the scheduling problem.
struct PaceJob {
  TimeNs release = 0;   // r_i
  TimeNs duration = 0;  // g_i
  TimeNs tail = 0;      // L_i
};

struct PaceInstance {
  std::vector<int32_t> tensor;  // jobs[k] belongs to dag tensor tensor[k]
  std::vector<PaceJob> jobs;
  std::vector<uint64_t> bytes;  // S_i of each job
  // Longest compute path that waits for no all-reduce: a floor under the iteration time.
  TimeNs compute_floor = 0;
};

// r_i, g_i and L_i for every tensor of `dag` (in tensor order).
PaceInstance BuildPaceInstance(const Dag& dag, const AllReduceCost& cost);

struct ScheduleSlice {
  int32_t job = 0;
  TimeNs start = 0;
  TimeNs end = 0;
};

struct PreemptiveSchedule {
  std::vector<TimeNs> completion;     // y_i per job
  std::vector<ScheduleSlice> slices;  // link occupancy in time order, adjacent slices merged
  TimeNs objective = 0;               // max_i (y_i + L_i); 0 with no jobs
  int preemptions = 0;                // slices that ended before their job finished
};

// Horn's rule (preemptive EDD on due date −L_i): optimal for 1|r_j,pmtn|Lmax. Error on a
// negative release, duration or tail.
absl::StatusOr<PreemptiveSchedule> HornSchedule(absl::Span<const PaceJob> jobs);

// max_i (completion_i + L_i), the objective of PACE (10), for any schedule's completions.
TimeNs PaceObjective(absl::Span<const PaceJob> jobs, absl::Span<const TimeNs> completion);

// Priorities that make a preemptive priority queue behave as Horn's rule: larger L_i first
// (0 = most urgent), ties by earlier release, then index. A permutation of 0..n-1.
std::vector<Priority> PacePriorities(absl::Span<const PaceJob> jobs);

struct PacePlan {
  PaceInstance instance;
  PreemptiveSchedule schedule;
  std::vector<Priority> priority;  // per dag tensor
  TimeNs iteration_time = 0;       // max(schedule.objective, instance.compute_floor)
};

// BuildPaceInstance + HornSchedule + PacePriorities.
absl::StatusOr<PacePlan> PlanPace(const Dag& dag, const AllReduceCost& cost);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_PACE_H_
