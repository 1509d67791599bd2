// sched/ready_queue.h — the priority queue of ready Segments that every priority policy shares.
//
// Order (SegmentBefore): a strict weak order — in fact a lexicographic total order on the
// fields below, so two segments are equivalent only if every one of these fields is equal —
// which makes every pop deterministic whatever the push order:
//   1. priority   (smaller = more urgent; P3 / ByteScheduler priority = forward-consumption order)
//   2. key        (tensor, then partition: a tensor's partitions go front to back, which is the
//                  order in which the next forward pass reads them)
//   3. iteration  (an older iteration's leftover first)
//   4. direction  (push before pull at equal key: a worker's own contribution unblocks the sum)
//   5. peer, offset, length, ready_at
// ready_at comes last on purpose: arrival time must not override urgency (that is FIFO's job).
//
// Guarantees: Push/Pop O(log n), Top O(1). Storage is a binary heap in a std::vector that is
// never shrunk, so once it has grown to the working size no call allocates (Reserve() can do
// the growing up front). Not thread-safe: one owner thread.
#ifndef GRADLANE_SCHED_READY_QUEUE_H_
#define GRADLANE_SCHED_READY_QUEUE_H_

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <vector>

#include "sched/types.h"

namespace gradlane::sched {

// True if `a` must be sent before `b`. See the order documented above.
inline bool SegmentBefore(const Segment& a, const Segment& b) {
  return std::tie(a.priority, a.key, a.iteration, a.direction, a.peer, a.offset, a.length,
                  a.ready_at) <
         std::tie(b.priority, b.key, b.iteration, b.direction, b.peer, b.offset, b.length,
                  b.ready_at);
}

class ReadyQueue {
 public:
  ReadyQueue() = default;

  // Grows storage so that `n` segments fit without another allocation.
  void Reserve(size_t n) { heap_.reserve(n); }

  void Push(const Segment& s) {
    heap_.push_back(s);
    queued_bytes_ += s.length;
    std::push_heap(heap_.begin(), heap_.end(), After);
  }

  // The most urgent segment. Requires !empty().
  const Segment& Top() const { return heap_.front(); }

  // Removes and returns the most urgent segment. Requires !empty().
  Segment Pop() {
    std::pop_heap(heap_.begin(), heap_.end(), After);
    Segment s = heap_.back();
    heap_.pop_back();  // keeps capacity
    queued_bytes_ -= s.length;
    return s;
  }

  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t queued_bytes() const { return queued_bytes_; }

 private:
  // std heap algorithms build a max-heap under the comparator: "After" puts the most urgent
  // segment at the front.
  static bool After(const Segment& a, const Segment& b) { return SegmentBefore(b, a); }

  std::vector<Segment> heap_;
  uint64_t queued_bytes_ = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_READY_QUEUE_H_
