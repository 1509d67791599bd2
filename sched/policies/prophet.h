// sched/policies/prophet.h — Prophet (ICPP'21, Alg. 1): gradient blocks sized from the learned
// stepwise pattern of gradient ready times and the live bandwidth.
//
// Interpretation of the paper for a per-host egress scheduler (what this class does):
//
// Learning c(i). The daemon sees no "backward started" signal, so an iteration starts with its
//   first push range (the first ReadyRange with direction kPush and a larger iteration number
//   than any seen so far; its time is t_start). A tensor's ready time in that iteration is the
//   arrival of its first push range, and c(i) = arrival − t_start. c(i) is smoothed over
//   iterations (first observation taken as is, then c += (obs − c) / 4), which is the profiling
//   of §4.2 done online instead of in a pre-training run. A tensor not seen during a whole
//   iteration is marked absent (never expected) until it shows up again.
//
// Bandwidth. E(i) = s(i) / B with B the latest OnLinkEstimate bytes/s (the estimator measures
//   while busy); PolicyConfig::initial_bandwidth_bytes_per_s until the first estimate. RTT is
//   not used: Alg. 1 plans by transmission time only.
//
// A(i). Alg. 1 line 1 defines A(i) = min |c(i) − c(j)|, j < i, "the i-th gradient is expected
//   to complete its transmission before the higher-priority gradients are generated". Taken
//   literally over all j, gradients of one step (ready together) would get A ≈ 0 from each
//   other; we apply the stated intent: at planning time `now`, the block for segment q must end
//   before the deadline D(q) = min over more-urgent tensors j (priority(j) < priority(q)) not
//   yet ready in this iteration of t_start + c(j). So A(q) − T_used is D(q) − now − T_used.
//
// Backward phase (push segments of the current iteration, gradient 0 not yet ready): lines
//   6–10. T_used starts at (bytes already in flight) / B — the block starts after them — and
//   ready segments are taken in priority order while now + T_used + E(q) <= D(q) and the block
//   stays within the free credit; all taken go out as ONE Dispatch (a block: one message per
//   peer, one per-message overhead). A block is one commit, so it never exceeds the window.
// Hold rule (gradlane's change to Alg. 1, work-conserving). If the head segment does not fit
//   before D (start = now + T_used, end = start + E):
//   * D is an intermediate gradient's (earlier than gradient 0's expected arrival): send the
//     head alone. Holding would idle the link, and that link time is never recovered when
//     communication dominates; the intermediate gradient still overtakes everything queued
//     when it arrives and waits only behind the committed window, as after a hold.
//   * D is gradient 0's (its pull gates the next forward pass): hold iff
//     overrun (end − D) >= idle (D − start), i.e. only when sending would delay gradient 0 by
//     more than the link time the hold wastes; a tie holds (Fig. 5). NextWakeup = D + slack.
//   Measured in gradlane-sim (8 profiles × 1/3/10/25 Gbit/s, W = 3; docs/simulator.md):
//   the paper's hold-whenever-it-does-not-fit rule with credit 2δ was 1.128× the ideal bound
//   (geomean; worst 1.47×, resnet18 3 Gbit/s) and slower than fifo in 19 of 32 cases; the
//   overrun-vs-idle rule for every deadline with credit 4δ 1.077×; never holding 1.052×;
//   the rule above with blocks bounded by the window 1.049× (worst 1.18×), never more than
//   1.2% behind fifo or bytescheduler. Partition size from live bandwidth was measured too
//   (δ = 1 or 2 MiB, window kept at 16 MiB): 1.057× and 1.049×, so δ stays 4 MiB.
// Late or unknown. If the more-urgent gradient that D waits for has not arrived by
//   D + kLateSlack, or any more-urgent tensor has no learned c yet (the whole first iteration),
//   the prediction is useless: segments go one by one in priority order under the credit
//   window (ByteScheduler behaviour), never held. The slack keeps a wake-up that coincides
//   with the predicted arrival from releasing the held segment just ahead of it.
// Forward phase (lines 13–18): once "gradient 0" — the most urgent registered tensor that is
//   not absent — has a ready push range in the current iteration, the remaining segments go one
//   by one in priority order (one segment per Dispatch) under the credit window, until the next
//   iteration's first push range. Gradient 0 itself is simply the most urgent queued segment.
// Pull direction (shard responses) and leftovers of an older iteration: priority order, one by
//   one, no block planning and no learning. They share the one queue, so a hold of the head
//   segment also holds whatever is less urgent behind it, pulls included.
//
// Defaults: δ = 4 MiB (as ByteScheduler), credit = 4 δ (as ByteScheduler). The window has to
// cover the acknowledgement delay, which includes queueing at the receiver's downlink shared
// with the other workers: with 2 δ the policies here lose up to 64% when link-bound (measured:
// prophet 1.077× → 1.108× of the ideal bound, bytescheduler up to 1.64×).
//
// Thread rules and allocation: as Policy. RegisterTensor may allocate (control path);
// OnReady/NextDispatch/OnAcked do not once the queue and the Dispatch vector reached their
// working size.
#ifndef GRADLANE_SCHED_POLICIES_PROPHET_H_
#define GRADLANE_SCHED_POLICIES_PROPHET_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sched/credit_window.h"
#include "sched/policy.h"
#include "sched/ready_queue.h"

namespace gradlane::sched {

inline constexpr uint64_t kProphetDefaultPartitionBytes = 4ull << 20;
inline constexpr uint64_t kProphetDefaultCreditPartitions = 4;
// How long past its predicted time a more-urgent gradient may still be waited for.
inline constexpr TimeNs kProphetLateSlack = 200 * kMicrosecond;

class ProphetPolicy final : public Policy {
 public:
  // config is already validated by MakePolicy.
  static std::unique_ptr<ProphetPolicy> Create(const PolicyConfig& config);

  std::string_view name() const override { return "prophet"; }
  void RegisterTensor(const TensorSpec& tensor) override;
  void OnReady(const ReadyRange& range, TimeNs now) override;
  void OnObservedReady(const ReadyRange& range, TimeNs now) override;
  bool NextDispatch(TimeNs now, Dispatch& out) override;
  void OnAcked(uint64_t bytes, TimeNs now) override;
  TimeNs NextWakeup(TimeNs now) const override;
  void OnLinkEstimate(double bytes_per_s, TimeNs rtt) override;
  size_t queued_segments() const override { return queue_.size(); }
  uint64_t credit_in_use() const override { return window_.in_use(); }

  // Introspection (metrics, tests).
  // Learned ready offset c(i) of a tensor within backward; nullopt if unknown or absent.
  std::optional<TimeNs> learned_ready_offset(uint32_t tensor_id) const;
  bool in_forward_phase() const { return forward_phase_; }
  double bandwidth_bytes_per_s() const { return bandwidth_; }
  uint64_t blocks_formed() const { return blocks_formed_; }
  uint64_t credit_capacity() const { return window_.capacity(); }

 private:
  // c(i) sentinels. Unknown sorts as "long overdue", so it forces one-by-one; absent is never
  // expected.
  static constexpr TimeNs kUnknown = -1;
  static constexpr TimeNs kAbsent = -2;
  static constexpr TimeNs kOverdue = std::numeric_limits<TimeNs>::min() / 4;

  struct TensorState {
    uint32_t id = 0;
    Priority priority = 0;
    TimeNs learned = kUnknown;  // c(i) relative to the iteration start, or a sentinel
    int64_t seen_iteration = std::numeric_limits<int64_t>::min();
  };

  ProphetPolicy(uint64_t partition_bytes, uint64_t credit_bytes, double bandwidth)
      : partition_bytes_(partition_bytes), window_(credit_bytes), bandwidth_(bandwidth) {}

  void StartIteration(int64_t iteration, TimeNs now);
  void NoteReady(uint32_t tensor_id, TimeNs now);
  void RebuildIndex();  // after the tensor set or order changed (control path: allocates)
  void RefreshTree();   // recompute every leaf, e.g. at an iteration start (no allocation)
  void SetTreeValue(size_t pos);
  TimeNs ExpectedValue(const TensorState& t) const;
  // Absolute predicted arrival of the earliest not-yet-ready tensor more urgent than
  // `priority` in the current iteration; kNever if none.
  TimeNs Deadline(Priority priority) const;
  bool Plans(const Segment& s) const;
  // Absolute expected arrival of gradient 0 in this iteration; kNever if ready, absent or none.
  TimeNs Gradient0Expected() const;
  // Whether the head segment (deadline D = Deadline(head), planned) is held (see header).
  bool HoldHead(TimeNs now, TimeNs deadline, uint64_t head_bytes) const;
  TimeNs TransmitNs(uint64_t bytes) const;
  void TakeOne(Dispatch& out);

  uint64_t partition_bytes_;
  ReadyQueue queue_;
  CreditWindow window_;
  double bandwidth_;  // bytes per second, > 0

  std::vector<TensorState> tensors_;                  // sorted by (priority, id)
  absl::flat_hash_map<uint32_t, uint32_t> position_;  // tensor id -> index in tensors_
  // Min segment tree over tensors_ order: c(i) of a tensor still expected this iteration,
  // kOverdue if unknown, kNever if already ready or absent. Leaves start at tree_leaves_.
  std::vector<TimeNs> tree_;
  size_t tree_leaves_ = 0;

  bool has_iteration_ = false;
  int64_t iteration_ = 0;
  TimeNs iteration_start_ = 0;
  bool forward_phase_ = false;
  size_t gradient0_pos_ = 0;  // index in tensors_ of "gradient 0"; tensors_.size() if none
  uint64_t blocks_formed_ = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_PROPHET_H_
