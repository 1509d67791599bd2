#include "sched/policies/bytescheduler.h"

#include "sched/partitioner.h"

namespace gradlane::sched {

void PartitionedPriorityPolicy::RegisterTensor(const TensorSpec& /*tensor*/) {
  // Ranges carry everything the plan needs (size, dtype, priority): no per-tensor state.
}

void PartitionedPriorityPolicy::OnReady(const ReadyRange& range, TimeNs now) {
  const uint64_t requested = range.dtype == DType::kF32 ? partition_f32_ : partition_16_;
  const PartitionPlan plan = PartitionPlan::Make(range.tensor_bytes, range.dtype, requested);
  CutRange(plan, range, now, [&](const Segment& s) { queue_.Push(s); });
}

bool PartitionedPriorityPolicy::NextDispatch(TimeNs /*now*/, Dispatch& out) {
  out.segments.clear();
  out.bytes = 0;
  if (queue_.empty() || !window_.CanAcquire(queue_.Top().length)) return false;
  out.segments.push_back(queue_.Pop());
  out.bytes = out.segments.back().length;
  window_.Acquire(out.bytes);
  return true;
}

void PartitionedPriorityPolicy::OnAcked(uint64_t bytes, TimeNs /*now*/) { window_.Release(bytes); }

TimeNs PartitionedPriorityPolicy::NextWakeup(TimeNs now) const {
  if (queue_.empty() || !window_.CanAcquire(queue_.Top().length)) return kNever;
  return now;
}

void PartitionedPriorityPolicy::OnLinkEstimate(double /*bytes_per_s*/, TimeNs /*rtt*/) {}

std::unique_ptr<Policy> ByteSchedulerPolicy::Create(const PolicyConfig& config) {
  const uint64_t partition =
      config.partition_bytes != 0 ? config.partition_bytes : kByteSchedulerDefaultPartitionBytes;
  const uint64_t credit = config.credit_bytes != 0
                              ? config.credit_bytes
                              : kByteSchedulerDefaultCreditPartitions * partition;
  return std::unique_ptr<Policy>(new ByteSchedulerPolicy(partition, credit));
}

}  // namespace gradlane::sched
