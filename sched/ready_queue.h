// sched/ready_queue.h — the priority queue of ready Segments that every priority policy shares.
//
// Order (SegmentBefore): a strict weak order — in fact a lexicographic total order on the
// fields below, so two segments are equivalent only if every one of these fields is equal —
// which makes every pop deterministic whatever the push order:
//   1. iteration  (an older iteration's leftover first, whatever its priority: see below)
//   2. priority   (smaller = more urgent; P3 / ByteScheduler priority = forward-consumption order)
//   3. round      (0 unless a policy slices partitions or counts arrivals: see Segment::round)
//   4. key        (tensor, then partition: a tensor's partitions go front to back, which is the
//                  order in which the next forward pass reads them)
//   5. direction  (push before pull at equal key: a worker's own contribution unblocks the sum)
//   6. peer, offset, length, ready_at
// Why iteration comes first: the only segments of two iterations that meet in one queue are a
// co-located shard's pull responses of iteration i and its worker's pushes of i + 1 (this rank
// finished i before a peer did). No partition of i + 1 can be reduced anywhere before every rank
// has posted i + 1, i.e. before every pull of i has arrived — so a push of i + 1 sent ahead of
// a pull of i only delays the peer that everyone then waits for. Ordered by priority and key
// instead, a one-tensor job's pushes of i + 1 overtook the last pulls of i, the peer finished
// i a whole tensor's transfer late (~220 ms for 256 MiB at 10 Gbit/s) and the two ranks fell
// out of step for several iterations (docs/benchmarks.md §2b).
// ready_at comes last on purpose: arrival time must not override urgency (that is FIFO's job).
//
// Guarantees: Push/Pop O(log n), Top O(1). Storage is a binary heap of small entries plus a
// slot array of Segments, all in std::vectors that are never shrunk, so once they have grown to
// the working size no call allocates (Reserve() can do the growing up front). Not thread-safe:
// one owner thread.
#ifndef GRADLANE_SCHED_READY_QUEUE_H_
#define GRADLANE_SCHED_READY_QUEUE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "sched/types.h"

namespace gradlane::sched {

// True if `a` must be sent before `b`. See the order documented above.
inline bool SegmentBefore(const Segment& a, const Segment& b) {
  return std::tie(a.iteration, a.priority, a.round, a.key, a.direction, a.peer, a.offset, a.length,
                  a.ready_at) < std::tie(b.iteration, b.priority, b.round, b.key, b.direction,
                                         b.peer, b.offset, b.length, b.ready_at);
}

class ReadyQueue {
 public:
  ReadyQueue() = default;

  // Grows storage so that `n` segments fit without another allocation.
  void Reserve(size_t n) {
    heap_.reserve(n);
    slots_.reserve(n);
    free_.reserve(n);
  }

  void Push(const Segment& s) {
    uint32_t slot;
    if (free_.empty()) {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.push_back(s);
    } else {
      slot = free_.back();
      free_.pop_back();
      slots_[slot] = s;
    }
    heap_.push_back({s.iteration, s.key, s.priority, s.round, slot});
    queued_bytes_ += s.length;
    std::push_heap(heap_.begin(), heap_.end(), After{this});
  }

  // The most urgent segment. Requires !empty(). Valid until the next Push or Pop.
  const Segment& Top() const { return slots_[heap_.front().slot]; }

  // Removes and returns the most urgent segment. Requires !empty().
  Segment Pop() {
    std::pop_heap(heap_.begin(), heap_.end(), After{this});
    const uint32_t slot = heap_.back().slot;
    heap_.pop_back();  // keeps capacity
    free_.push_back(slot);
    queued_bytes_ -= slots_[slot].length;
    return slots_[slot];
  }

  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  uint64_t queued_bytes() const { return queued_bytes_; }

 private:
  // The heap moves 32-byte entries holding the four leading sort fields, so sifting touches
  // little memory; the full Segment is read only to break an (iteration, priority, round, key)
  // tie — common in PS mode, where a shard sends the same key to every worker. `round` took the
  // entry from 24 to 32 bytes: tests/bench/sched_bench's bytescheduler went from 73 to 83 ns a
  // segment (debugoptimized, 2 shared cores), noise next to the daemon's ~3 µs per message,
  // so the fields stay plain rather than packed.
  struct Entry {
    int64_t iteration;
    SegmentKey key;
    Priority priority;
    uint32_t round;
    uint32_t slot;  // index into slots_
  };
  static_assert(sizeof(Entry) == 32, "heap entries should stay small: they are what sifts move");

  // std heap algorithms build a max-heap under the comparator: "After" puts the most urgent
  // segment at the front.
  struct After {
    const ReadyQueue* q;
    bool operator()(const Entry& a, const Entry& b) const {
      if (a.iteration != b.iteration) return b.iteration < a.iteration;
      if (a.priority != b.priority) return b.priority < a.priority;
      if (a.round != b.round) return b.round < a.round;
      if (a.key != b.key) return b.key < a.key;
      return SegmentBefore(q->slots_[b.slot], q->slots_[a.slot]);
    }
  };

  std::vector<Entry> heap_;
  std::vector<Segment> slots_;  // segment storage, reused through free_
  std::vector<uint32_t> free_;
  uint64_t queued_bytes_ = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_READY_QUEUE_H_
