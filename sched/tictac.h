// sched/tictac.h — TicTac (Hashemi et al., SysML'19): priorities for the parameter transfers
// (recv ops) of a worker DAG, so that transfers that unblock computation go first.
//
//   TIC (§4.2, Alg. 2): structure only. One UpdateProperties pass with the general time oracle
//       (recv = 1, everything else = 0); a recv's priority number is its M⁺.
//   TAC (§4.3, Alg. 3): timing-aware. Repeatedly recompute the properties of the outstanding
//       recvs (Alg. 1) and take the minimum with respect to the comparator, which orders A before
//       B iff min{P_B, M_A} < min{P_A, M_B} (Eq. 2), ties broken by the smaller M⁺.
//
// Note on Alg. 3: as printed, its Comparator returns min(P_A, M_B) < min(P_B, M_A), the reverse
// of Eq. 2 and of the derivation above it (T(A→B) < T(B→A)). We implement Eq. 2, which the
// derivation proves; tests/unit/sched/tictac_test.cc checks it against a simulated Fig. 5a.
//
// Also the §3.2 metrics: overlap coefficient α = (N + C − T) / min(N, C) and utilization
// U = C / T, plus a small list-scheduling simulation of one iteration (one link, one compute
// device) that yields N, C and T for a given recv order.
//
// Guarantees: pure functions of their inputs, deterministic (ties broken by op index), no I/O,
// no clock. Cost: TIC is one pass, O(Σ|op.dep|); TAC repeats it once per recv, O(R·Σ|op.dep|)
// (a 360-layer chain, 1440 ops: ~0.4 s), which is why it runs once, offline, as in the paper. A
// time oracle is a vector of per-op times in any consistent unit (TimeNs for TAC, counts for TIC);
// values must be non-negative.
#ifndef GRADLANE_SCHED_TICTAC_H_
#define GRADLANE_SCHED_TICTAC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sched/dag.h"
#include "sched/types.h"

namespace gradlane::sched {

// M⁺ of a recv whose activation needs no other outstanding recv (Alg. 1 initialises M⁺ to +∞).
inline constexpr TimeNs kInfiniteTime = kNever;

// TicTac §4.1 properties of one outstanding recv op.
struct RecvProperties {
  int32_t op = -1;
  TimeNs m = 0;                   // M: its own transfer time
  TimeNs p = 0;                   // P: compute that only this recv unblocks
  TimeNs m_plus = kInfiniteTime;  // M⁺: least transfer time to activate an op needing ≥ 2 recvs
};

// op.dep for every op (§4.1): the recv ops (op indices, ascending) it depends on directly or
// transitively. A recv depends on itself, so its M is its own transfer time.
std::vector<std::vector<int32_t>> FindDependencies(const Dag& dag);

// Alg. 1 for the outstanding recvs (`outstanding[op]` true for recv ops not yet transferred;
// sized num_ops). `time[op]` is the time oracle. `deps` from FindDependencies. Returns the
// properties of each outstanding recv, in op-index order. P counts compute ops only: send ops
// occupy the link, not the compute device, so completing a recv gains no computation from them.
std::vector<RecvProperties> UpdateProperties(const Dag& dag,
                                             const std::vector<std::vector<int32_t>>& deps,
                                             absl::Span<const TimeNs> time,
                                             const std::vector<bool>& outstanding);

// The TAC comparator: true iff `a` should be transferred before `b` (Eq. 2, then M⁺). It is a
// strict ordering only within one UpdateProperties round, which is all TAC uses it for.
bool TacBefore(const RecvProperties& a, const RecvProperties& b);

// The general time oracle of Eq. 1: 1 for recv ops, 0 otherwise.
std::vector<TimeNs> GeneralTimeOracle(const Dag& dag);
// A time oracle from the DAG's compute durations and a link of `bytes_per_s` for recv/send ops
// (rounded up to whole nanoseconds). Error if bytes_per_s is not positive.
absl::StatusOr<std::vector<TimeNs>> LinkTimeOracle(const Dag& dag, double bytes_per_s);

// Per tensor (index into dag.tensors()): TIC priority numbers. Recvs with equal M⁺ share a
// priority (§3.1: "multiple ops may be assigned the same priority if their relative order is
// insignificant"); numbers are the dense ranks of M⁺, 0 = first. Tensors without a recv op come
// after all of them.
std::vector<Priority> TicPriorities(const Dag& dag);

// Per tensor: TAC order (Alg. 3), a permutation 0..k-1 of the k tensors that have a recv op;
// tensors without one follow, in index order. Error if `time` is not sized num_ops or has a
// negative entry.
absl::StatusOr<std::vector<Priority>> TacPriorities(const Dag& dag, absl::Span<const TimeNs> time);

// §3.2. α = (N + C − T) / min(N, C) ∈ [0, 1] for a consistent schedule; 1 when min(N, C) = 0
// (nothing could overlap, and nothing was lost).
double OverlapCoefficient(TimeNs comm, TimeNs compute, TimeNs iteration);
// U = C / T (0 if T = 0 and C = 0 would be undefined: returns 1 then).
double Utilization(TimeNs compute, TimeNs iteration);
// U from ρ = N / C and α: 1 / (1 + ρ − α·min(ρ, 1)).
double UtilizationFromRatio(double rho, double alpha);

struct IterationTimes {
  TimeNs comm = 0;       // N: total link time of all recv and send ops
  TimeNs compute = 0;    // C: total compute time
  TimeNs iteration = 0;  // T: completion of the last op
};

// One iteration of `dag` on one link and one compute device, non-preemptive (§3.1's resource
// model): the link transfers the recvs back to back in `recv_order` (tensor indices, each
// tensor with a recv exactly once), then serves send ops in the order they become ready; the
// compute device runs ready compute ops, earliest-ready first (ties by op index).
absl::StatusOr<IterationTimes> SimulateIteration(const Dag& dag, absl::Span<const TimeNs> time,
                                                 absl::Span<const int32_t> recv_order);

// The recv order a priority vector (per tensor) implies: by priority, ties by tensor index.
std::vector<int32_t> RecvOrderFromPriorities(const Dag& dag, absl::Span<const Priority> prio);

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_TICTAC_H_
