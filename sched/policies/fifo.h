// sched/policies/fifo.h — the vanilla framework baseline: arrival order, whole tensors, no window.
//
// What a framework without a scheduler does: each ready range goes out, unpartitioned, in the
// order it became ready, and nothing is held back (no credit window), so a large, late-needed
// tensor ahead of an urgent one delays it by its full transfer time (P3 Fig. 4a, Prophet Fig. 5
// "default MXNet"). partition_bytes and credit_bytes of PolicyConfig are ignored: a shared
// "--policy all" config must still be able to run the baseline.
//
// Each ready range becomes one Segment, keyed as partition 0 of its tensor (a whole-tensor
// plan has one partition), and one Dispatch per segment. NextDispatch never holds anything back.
//
// Thread rules and allocation: as Policy (one owner thread; the ring grows by doubling until it
// reaches the working size, then never allocates).
#ifndef GRADLANE_SCHED_POLICIES_FIFO_H_
#define GRADLANE_SCHED_POLICIES_FIFO_H_

#include <memory>
#include <vector>

#include "sched/credit_window.h"
#include "sched/policy.h"

namespace gradlane::sched {

class FifoPolicy final : public Policy {
 public:
  static std::unique_ptr<Policy> Create(const PolicyConfig& config);

  std::string_view name() const override { return "fifo"; }
  void RegisterTensor(const TensorSpec& tensor) override;
  void OnReady(const ReadyRange& range, TimeNs now) override;
  bool NextDispatch(TimeNs now, Dispatch& out) override;
  void OnAcked(uint64_t bytes, TimeNs now) override;
  TimeNs NextWakeup(TimeNs now) const override;
  void OnLinkEstimate(double bytes_per_s, TimeNs rtt) override;
  size_t queued_segments() const override { return size_; }
  uint64_t credit_in_use() const override { return window_.in_use(); }

 private:
  FifoPolicy() = default;
  void Grow();

  // Ring buffer, power-of-two capacity: head_ is the oldest segment.
  std::vector<Segment> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
  // Unlimited: only tracks bytes in flight for metrics.
  CreditWindow window_{CreditWindow::kUnlimited};
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_POLICIES_FIFO_H_
