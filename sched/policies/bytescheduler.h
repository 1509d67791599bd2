// sched/policies/bytescheduler.h — ByteScheduler (SOSP'19) Alg. 1: partition every tensor into
// δ-byte partitions, queue ready partitions by priority, and commit the most urgent one whenever
// the credit window (§4.2) admits it.
//
// Defaults (PolicyConfig fields left 0):
//   δ = 4 MiB. Table 1 of the paper reports auto-tuned PS partitions of 3–6 MB for VGG16,
//       ResNet50 and Transformer; 4 MiB sits in that range and keeps the per-message overhead
//       (§4.1) small on 10–100 Gbit/s links.
//   c = 4 δ (16 MiB). Table 1's tuned PS credits are 3–6× the partition; 4× keeps the socket
//       buffer full across an ack round trip at 10 Gbit/s while an urgent arrival waits behind
//       at most four partitions.
// δ is aligned down to whole elements per tensor and raised for tensors that would exceed
// 65536 partitions (PartitionPlan). The window admits a partition larger than the whole credit
// when nothing is in flight (CreditWindow), so no configuration can deadlock.
//
// PartitionedPriorityPolicy is the shared core (partition + ready queue + window); P3 is the
// same algorithm with its own partition rule and a stop-and-wait window (p3.h).
//
// Thread rules and allocation: as Policy.
#ifndef GRADLANE_SCHED_POLICIES_BYTESCHEDULER_H_
#define GRADLANE_SCHED_POLICIES_BYTESCHEDULER_H_

#include <memory>
#include <string>

#include "sched/credit_window.h"
#include "sched/policy.h"
#include "sched/ready_queue.h"

namespace gradlane::sched {

inline constexpr uint64_t kByteSchedulerDefaultPartitionBytes = 4ull << 20;
inline constexpr uint64_t kByteSchedulerDefaultCreditPartitions = 4;

class PartitionedPriorityPolicy : public Policy {
 public:
  std::string_view name() const override { return name_; }
  void RegisterTensor(const TensorSpec& tensor) override;
  void OnReady(const ReadyRange& range, TimeNs now) override;
  // Alg. 1 SCHEDULE: pops the most urgent segment if the window admits it; one segment per
  // Dispatch. Never holds a segment for any reason but credit.
  bool NextDispatch(TimeNs now, Dispatch& out) override;
  void OnAcked(uint64_t bytes, TimeNs now) override;
  // Only an ack can unblock it: kNever unless a dispatch is possible right now.
  TimeNs NextWakeup(TimeNs now) const override;
  void OnLinkEstimate(double bytes_per_s, TimeNs rtt) override;
  size_t queued_segments() const override { return queue_.size(); }
  uint64_t credit_in_use() const override { return window_.in_use(); }

  uint64_t credit_capacity() const { return window_.capacity(); }

 protected:
  // δ asked of the partitioner for f32 tensors and for f16/bf16 tensors (P3 sizes slices in
  // parameters, so its byte size depends on the dtype), and the credit window in bytes
  // (0 = stop-and-wait, see CreditWindow).
  PartitionedPriorityPolicy(std::string name, uint64_t partition_bytes_f32,
                            uint64_t partition_bytes_16bit, uint64_t credit_bytes)
      : name_(std::move(name)),
        partition_f32_(partition_bytes_f32),
        partition_16_(partition_bytes_16bit),
        window_(credit_bytes) {}

 private:
  std::string name_;
  uint64_t partition_f32_;
  uint64_t partition_16_;
  ReadyQueue queue_;
  CreditWindow window_;
};

class ByteSchedulerPolicy final : public PartitionedPriorityPolicy {
 public:
  // config is already validated by MakePolicy.
  static std::unique_ptr<Policy> Create(const PolicyConfig& config);

 private:
  ByteSchedulerPolicy(uint64_t partition_bytes, uint64_t credit_bytes)
      : PartitionedPriorityPolicy("bytescheduler", partition_bytes, partition_bytes, credit_bytes) {
  }
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_BYTESCHEDULER_H_
