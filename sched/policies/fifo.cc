#include "sched/policies/fifo.h"

#include "sched/partitioner.h"

namespace gradlane::sched {

std::unique_ptr<Policy> FifoPolicy::Create(const PolicyConfig& /*config*/) {
  return std::unique_ptr<Policy>(new FifoPolicy());
}

void FifoPolicy::RegisterTensor(const TensorSpec& /*tensor*/) {}

void FifoPolicy::Grow() {
  std::vector<Segment> bigger(ring_.empty() ? 64 : ring_.size() * 2);
  for (size_t i = 0; i < size_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
  ring_.swap(bigger);
  head_ = 0;
}

void FifoPolicy::OnReady(const ReadyRange& range, TimeNs now) {
  const PartitionPlan plan = PartitionPlan::Make(range.tensor_bytes, range.dtype, 0);
  CutRange(plan, range, now, [&](const Segment& s) {
    if (size_ == ring_.size()) Grow();
    ring_[(head_ + size_) & (ring_.size() - 1)] = s;
    ++size_;
  });
}

bool FifoPolicy::NextDispatch(TimeNs /*now*/, Dispatch& out) {
  out.segments.clear();
  out.bytes = 0;
  if (size_ == 0) return false;
  const Segment& s = ring_[head_];
  out.segments.push_back(s);
  out.bytes = s.length;
  head_ = (head_ + 1) & (ring_.size() - 1);
  --size_;
  window_.Acquire(out.bytes);
  return true;
}

void FifoPolicy::OnAcked(uint64_t bytes, TimeNs /*now*/) { window_.Release(bytes); }

TimeNs FifoPolicy::NextWakeup(TimeNs now) const { return size_ == 0 ? kNever : now; }

void FifoPolicy::OnLinkEstimate(double /*bytes_per_s*/, TimeNs /*rtt*/) {}

}  // namespace gradlane::sched
