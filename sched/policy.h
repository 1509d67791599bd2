// sched/policy.h — the one interface every communication-scheduling policy implements.
//
// A Policy is the egress scheduler of one host: it decides in what order, and how many at a
// time, ready segments are committed to the FIFO part of the network stack (socket buffer,
// NIC queue), where a later, more urgent segment can no longer overtake them. Pushes (this
// host as a worker) and pull responses (this host as a parameter-server shard) go through the
// same policy, so both are served by priority (P3 §4.2, ByteScheduler Thm 1).
//
// Contract, shared by the simulator and the daemon:
//   1. The caller feeds ready byte ranges with OnReady(); the policy partitions them.
//   2. Whenever something may have changed (a ready range, an ack, a wake-up time reached) the
//      caller calls NextDispatch() in a loop until it returns false, and commits each Dispatch
//      to the transport in the order returned. Segments of one Dispatch that share a peer may
//      be coalesced into one message (a Prophet block).
//   3. When the peer acknowledges receipt of a dispatch's bytes the caller calls OnAcked() with
//      that dispatch's byte count; that returns credit.
//   4. If NextDispatch() returned false with segments still queued, NextWakeup() says when to
//      call it again even if no other event happens (kNever: only an event can unblock it).
//
// Guarantees: no I/O, no clock (time comes in as `now`, non-decreasing across calls), fully
// deterministic. Not thread-safe: one owner thread (the daemon's engine thread, or the
// simulator). No allocation in OnReady/NextDispatch/OnAcked once the queue has grown to its
// working size (storage is reused).
#ifndef GRADLANE_SCHED_POLICY_H_
#define GRADLANE_SCHED_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sched/types.h"

namespace gradlane::sched {

// What a policy hands the transport in one step: one or more segments committed together.
// `segments` is owned by the caller and reused between calls (cleared by the policy).
struct Dispatch {
  std::vector<Segment> segments;
  uint64_t bytes = 0;  // sum of segment lengths; the amount to pass back to OnAcked()
};

struct PolicyConfig {
  // fifo | p3 | bytescheduler | prophet | gradlane | gradlane-rules (gradlane's rules alone,
  // without its outer loop over candidate schedules: policies/gradlane_selector.h)
  std::string name = "bytescheduler";
  // Partition size δ in bytes (0: the policy's default: p3 ≈ 50k params, bytescheduler 4 MB,
  // prophet 4 MB, fifo whole tensors).
  uint64_t partition_bytes = 0;
  // Credit window in bytes (0: the policy's default: p3 one partition, bytescheduler 4×δ).
  uint64_t credit_bytes = 0;
  // Initial link bandwidth guess for policies that plan by time (Prophet) until the estimator
  // reports; bytes per second.
  double initial_bandwidth_bytes_per_s = 1.25e9;
  // Per-message cost θ on the sender's link (framing, syscall, ack handling), for policies that
  // size messages by it (gradlane). The simulator passes its own θ; the daemon keeps this
  // default: gradlaned's own θ over TCP, 2.4–3.8 µs in three runs of tests/bench/theta.sh
  // (docs/benchmarks.md, "Per-message cost θ"), the same as gradlane-sim's --overhead_us.
  TimeNs per_message_overhead_ns = 3 * kMicrosecond;
};

class Policy {
 public:
  virtual ~Policy() = default;

  virtual std::string_view name() const = 0;

  // Tells the policy the tensor exists before any of its ranges arrive. Optional for policies
  // that need no per-tensor state; the daemon and simulator always call it.
  virtual void RegisterTensor(const TensorSpec& tensor) = 0;

  // Bytes [offset, offset+length) of a tensor became ready at `now`.
  virtual void OnReady(const ReadyRange& range, TimeNs now) = 0;

  // The same range, handed to another schedule to send (gradlane's candidates that are not
  // running): a policy that learns from the ready pattern or the load (prophet's ready times,
  // gradlane's bytes per iteration) learns from it as from OnReady, and queues nothing, so
  // that it is warm when it runs. The default learns nothing.
  virtual void OnObservedReady(const ReadyRange& /*range*/, TimeNs /*now*/) {}

  // Fills `out` with the next unit to commit, if the policy's rules and credit allow one now.
  virtual bool NextDispatch(TimeNs now, Dispatch& out) = 0;

  // The peer acknowledged `bytes` (a Dispatch::bytes value) at `now`: credit comes back.
  virtual void OnAcked(uint64_t bytes, TimeNs now) = 0;

  // Earliest time NextDispatch may succeed without another event; kNever if only an event can.
  virtual TimeNs NextWakeup(TimeNs now) const = 0;

  // Live link estimate from the bandwidth/RTT estimator (bytes/s while busy, smoothed RTT).
  virtual void OnLinkEstimate(double bytes_per_s, TimeNs rtt) = 0;

  // Job-wide agreement, for a policy whose choice must be the same on every host of a job
  // (gradlane's choice among candidate schedules: policies/gradlane_selector.h). The caller
  // gives the policy its host's rank once, before the first range; stamps every data message
  // it sends with Decision() as it is committed; and passes the stamp of every data message it
  // receives to OnPeerDecision(). 0 means "nothing to agree on"; the other policies keep these
  // defaults. Without SetRank a policy acts as rank 0, which decides for the job.
  virtual void SetRank(uint16_t /*rank*/) {}
  virtual uint8_t Decision() const { return 0; }
  virtual void OnPeerDecision(uint8_t /*decision*/, TimeNs /*now*/) {}

  // Introspection for metrics and tests.
  // The schedule running now: the policy's name, or for gradlane the candidate it chose (or is
  // trying).
  virtual std::string_view schedule() const { return name(); }
  virtual size_t queued_segments() const = 0;
  virtual uint64_t credit_in_use() const = 0;
};

// Builds a policy by name; an unknown name or an invalid size is an InvalidArgument error.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(const PolicyConfig& config);

// The partition size δ the named policy cuts with when PolicyConfig::partition_bytes is 0:
// 0 for fifo (whole tensors) and for an unknown name.
uint64_t DefaultPartitionBytes(std::string_view policy, DType dtype);

// The names MakePolicy accepts, in a stable order (for "--policy all").
const std::vector<std::string>& PolicyNames();

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICY_H_
