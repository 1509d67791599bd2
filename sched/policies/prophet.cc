#include "sched/policies/prophet.h"

#include <algorithm>
#include <cmath>

#include "sched/partitioner.h"

namespace gradlane::sched {

std::unique_ptr<ProphetPolicy> ProphetPolicy::Create(const PolicyConfig& config) {
  const uint64_t partition =
      config.partition_bytes != 0 ? config.partition_bytes : kProphetDefaultPartitionBytes;
  const uint64_t credit =
      config.credit_bytes != 0 ? config.credit_bytes : kProphetDefaultCreditPartitions * partition;
  return std::unique_ptr<ProphetPolicy>(
      new ProphetPolicy(partition, credit, config.initial_bandwidth_bytes_per_s));
}

void ProphetPolicy::RegisterTensor(const TensorSpec& tensor) {
  auto it = position_.find(tensor.id);
  if (it != position_.end()) {
    tensors_[it->second].priority = tensor.priority;
  } else {
    TensorState state;
    state.id = tensor.id;
    state.priority = tensor.priority;
    tensors_.push_back(state);
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorState& a, const TensorState& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.id < b.id;
  });
  RebuildIndex();
}

void ProphetPolicy::RebuildIndex() {
  position_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) position_[tensors_[i].id] = static_cast<uint32_t>(i);
  tree_leaves_ = 1;
  while (tree_leaves_ < tensors_.size()) tree_leaves_ *= 2;
  tree_.assign(2 * tree_leaves_, kNever);
  RefreshTree();
}

TimeNs ProphetPolicy::ExpectedValue(const TensorState& t) const {
  if (has_iteration_ && t.seen_iteration == iteration_) return kNever;  // already ready
  if (t.learned == kUnknown) return kOverdue;
  if (t.learned == kAbsent) return kNever;
  return t.learned;
}

void ProphetPolicy::RefreshTree() {
  for (size_t i = 0; i < tensors_.size(); ++i) tree_[tree_leaves_ + i] = ExpectedValue(tensors_[i]);
  for (size_t node = tree_leaves_ - 1; node >= 1; --node) {
    tree_[node] = std::min(tree_[2 * node], tree_[2 * node + 1]);
  }
  gradient0_pos_ = tensors_.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].learned != kAbsent) {
      gradient0_pos_ = i;
      break;
    }
  }
}

void ProphetPolicy::SetTreeValue(size_t pos) {
  size_t node = tree_leaves_ + pos;
  tree_[node] = ExpectedValue(tensors_[pos]);
  for (node /= 2; node >= 1; node /= 2)
    tree_[node] = std::min(tree_[2 * node], tree_[2 * node + 1]);
}

void ProphetPolicy::StartIteration(int64_t iteration, TimeNs now) {
  if (has_iteration_) {
    for (TensorState& t : tensors_) {
      // Never ready during a whole iteration: stop expecting it (a frozen layer, a tensor this
      // host only pulls), or it would force one-by-one for everything less urgent forever.
      if (t.seen_iteration != iteration_ && t.learned == kUnknown) t.learned = kAbsent;
    }
  }
  has_iteration_ = true;
  iteration_ = iteration;
  iteration_start_ = now;
  forward_phase_ = false;
  RefreshTree();  // O(T) once per iteration, no allocation
}

void ProphetPolicy::NoteReady(uint32_t tensor_id, TimeNs now) {
  auto it = position_.find(tensor_id);
  if (it == position_.end()) return;  // unregistered: scheduled by priority, nothing to learn
  const size_t pos = it->second;
  TensorState& t = tensors_[pos];
  if (t.seen_iteration == iteration_) return;  // only the first range marks "ready"
  t.seen_iteration = iteration_;
  const TimeNs observed = now - iteration_start_;
  t.learned = t.learned < 0 ? observed : t.learned + (observed - t.learned) / 4;
  SetTreeValue(pos);
  if (pos == gradient0_pos_) forward_phase_ = true;
}

void ProphetPolicy::OnObservedReady(const ReadyRange& range, TimeNs now) {
  if (range.direction == Direction::kPush) {
    if (!has_iteration_ || range.iteration > iteration_) StartIteration(range.iteration, now);
    if (range.iteration == iteration_) NoteReady(range.tensor_id, now);
  }
}

void ProphetPolicy::OnReady(const ReadyRange& range, TimeNs now) {
  OnObservedReady(range, now);
  const PartitionPlan plan = PartitionPlan::Make(range.tensor_bytes, range.dtype, partition_bytes_);
  CutRange(plan, range, now, [&](const Segment& s) { queue_.Push(s); });
}

TimeNs ProphetPolicy::Deadline(Priority priority) const {
  if (!has_iteration_) return kNever;
  // Tensors strictly more urgent than `priority` occupy the prefix [0, end) of tensors_.
  const size_t end = static_cast<size_t>(
      std::lower_bound(tensors_.begin(), tensors_.end(), priority,
                       [](const TensorState& t, Priority p) { return t.priority < p; }) -
      tensors_.begin());
  TimeNs m = kNever;
  for (size_t lo = tree_leaves_, hi = tree_leaves_ + end; lo < hi; lo /= 2, hi /= 2) {
    if (lo & 1) m = std::min(m, tree_[lo++]);
    if (hi & 1) m = std::min(m, tree_[--hi]);
  }
  return m == kNever ? kNever : iteration_start_ + m;
}

bool ProphetPolicy::Plans(const Segment& s) const {
  return s.direction == Direction::kPush && has_iteration_ && s.iteration == iteration_ &&
         !forward_phase_;
}

TimeNs ProphetPolicy::TransmitNs(uint64_t bytes) const {
  return static_cast<TimeNs>(std::ceil(static_cast<double>(bytes) * 1e9 / bandwidth_));
}

void ProphetPolicy::TakeOne(Dispatch& out) {
  out.segments.push_back(queue_.Pop());
  out.bytes += out.segments.back().length;
}

TimeNs ProphetPolicy::Gradient0Expected() const {
  if (!has_iteration_ || gradient0_pos_ >= tensors_.size()) return kNever;
  const TimeNs v = tree_[tree_leaves_ + gradient0_pos_];
  return v == kNever ? kNever : iteration_start_ + v;
}

bool ProphetPolicy::HoldHead(TimeNs now, TimeNs deadline, uint64_t head_bytes) const {
  const TimeNs start = now + TransmitNs(window_.in_use());  // the link is busy until then
  const TimeNs end = start + TransmitNs(head_bytes);
  if (end <= deadline) return false;  // fits: Alg. 1 sends it (as part of a block)
  // Does not fit. Only gradient 0's arrival is worth idling the link for: its pull gates the
  // next forward pass. A more urgent *intermediate* gradient overtakes everything still queued
  // when it arrives and waits behind at most the committed window, exactly as it would after
  // a hold that ended with the link busy; holding for it only idles the link (measured: the
  // paper rule loses up to 25% to fifo when link-bound, docs/simulator.md).
  if (deadline < Gradient0Expected()) return false;
  // Gradient 0: hold iff the idle time the hold costs is not larger than the delay sending
  // would cause it (overrun = end − D vs idle = D − start; strict, so a tie holds: Fig. 5).
  return end - deadline >= deadline - start;
}

bool ProphetPolicy::NextDispatch(TimeNs now, Dispatch& out) {
  out.segments.clear();
  out.bytes = 0;
  if (queue_.empty() || !window_.CanAcquire(queue_.Top().length)) return false;

  const Segment& head = queue_.Top();
  TimeNs deadline = Plans(head) ? Deadline(head.priority) : kNever;
  if (deadline == kNever || now >= deadline + kProphetLateSlack) {
    // Forward phase, pulls, stragglers, or a prediction that has already failed: one by one.
    TakeOne(out);
    window_.Acquire(out.bytes);
    return true;
  }
  if (HoldHead(now, deadline, head.length)) return false;  // until D + slack (NextWakeup)

  // Backward phase, Alg. 1 lines 6–10: the block must drain before D(q) and stay within the
  // credit window (a block is one commit: credit returns only when all of it is acked, and a
  // block larger than the window would shut out every urgent arrival behind it). The head is
  // taken even if it overruns D (HoldHead decided that sending pays off); then it goes alone.
  TimeNs used = TransmitNs(window_.in_use());
  while (!queue_.empty()) {
    const Segment& q = queue_.Top();
    const TimeNs e = TransmitNs(q.length);
    if (!out.segments.empty()) {
      if (!Plans(q)) break;
      deadline = Deadline(q.priority);  // never later than for the previous q
      if (out.bytes + q.length > window_.available()) break;
      if (now + used + e > deadline) break;
    }
    used += e;
    TakeOne(out);
    if (now + used > deadline) break;  // an overrunning head is sent alone
  }
  if (out.segments.size() > 1) ++blocks_formed_;
  window_.Acquire(out.bytes);
  return true;
}

TimeNs ProphetPolicy::NextWakeup(TimeNs now) const {
  if (queue_.empty() || !window_.CanAcquire(queue_.Top().length)) return kNever;
  const Segment& head = queue_.Top();
  const TimeNs deadline = Plans(head) ? Deadline(head.priority) : kNever;
  if (deadline == kNever || now >= deadline + kProphetLateSlack) return now;
  // A hold only gets longer as time passes without an event (an ack or a ready range, which
  // re-run NextDispatch anyway), so the next chance is when the prediction fails.
  if (HoldHead(now, deadline, head.length)) return deadline + kProphetLateSlack;
  return now;
}

void ProphetPolicy::OnAcked(uint64_t bytes, TimeNs /*now*/) { window_.Release(bytes); }

void ProphetPolicy::OnLinkEstimate(double bytes_per_s, TimeNs /*rtt*/) {
  if (std::isfinite(bytes_per_s) && bytes_per_s > 0) bandwidth_ = bytes_per_s;
}

std::optional<TimeNs> ProphetPolicy::learned_ready_offset(uint32_t tensor_id) const {
  auto it = position_.find(tensor_id);
  if (it == position_.end()) return std::nullopt;
  const TimeNs c = tensors_[it->second].learned;
  if (c < 0) return std::nullopt;
  return c;
}

}  // namespace gradlane::sched
