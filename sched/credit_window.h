// sched/credit_window.h — ByteScheduler's credit-based preemption window (SOSP'19 §4.2, Alg. 1),
// counted in bytes.
//
// Why: bytes handed to the transport enter a FIFO (socket buffer, NIC queue) where a later, more
// urgent segment can no longer overtake them. The window bounds those bytes: a small window keeps
// preemption timely, a larger one keeps the link busy across acknowledgement round trips.
// Credit is taken when a dispatch is committed and returned when the peer acknowledges it.
//
// Admission rule: a dispatch of `bytes` is admitted if
//     in_use == 0   ||   in_use + bytes <= capacity.
// * `<=` rather than Alg. 1's `credit > size`: with the strict test a window of exactly two
//   equal tensors could never hold two, contradicting the paper's own §4.2 example (window of
//   two: tensor 2 is sent while tensor 1 is still in flight).
// * `in_use == 0` is the no-deadlock rule: a dispatch larger than the whole window (a huge
//   partition, a Prophet block) is still sent when nothing is in flight, alone. Hence the
//   invariant: in_use <= capacity, or exactly one dispatch is in flight.
// * capacity 0 is stop-and-wait (P3): one dispatch in flight at a time, whatever its size.
// * capacity kUnlimited is no window at all (FIFO baseline).
//
// Not thread-safe: one owner thread. No allocation, no clock.
#ifndef GRADLANE_SCHED_CREDIT_WINDOW_H_
#define GRADLANE_SCHED_CREDIT_WINDOW_H_

#include <cstdint>
#include <limits>

namespace gradlane::sched {

class CreditWindow {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  explicit CreditWindow(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Whether a dispatch of `bytes` may be committed now (see the admission rule above).
  bool CanAcquire(uint64_t bytes) const {
    return in_use_ == 0 || (bytes <= capacity_ && in_use_ <= capacity_ - bytes);
  }

  // Takes credit for a committed dispatch. Call only after CanAcquire(bytes) returned true.
  void Acquire(uint64_t bytes) {
    in_use_ += bytes;
    ++in_flight_dispatches_;
  }

  // The peer acknowledged a dispatch of `bytes`. Returns false (and clamps to zero) if that is
  // more than is in use: an ack the window never handed out, i.e. a caller bug worth counting.
  bool Release(uint64_t bytes) {
    if (in_flight_dispatches_ > 0) --in_flight_dispatches_;
    if (bytes > in_use_) {
      in_use_ = 0;
      in_flight_dispatches_ = 0;
      return false;
    }
    in_use_ -= bytes;
    if (in_use_ == 0) in_flight_dispatches_ = 0;
    return true;
  }

  // Bytes that could still be admitted without relying on the empty-window rule.
  uint64_t available() const { return in_use_ >= capacity_ ? 0 : capacity_ - in_use_; }
  uint64_t in_use() const { return in_use_; }
  uint64_t capacity() const { return capacity_; }
  // Dispatches acquired and not yet released (acks carry bytes, so this is approximate only if
  // the caller acknowledges several dispatches with one summed OnAcked call).
  uint32_t in_flight_dispatches() const { return in_flight_dispatches_; }

 private:
  uint64_t capacity_;
  uint64_t in_use_ = 0;
  uint32_t in_flight_dispatches_ = 0;
};

}  // namespace gradlane::sched

#endif  // GRADLANE_SCHED_CREDIT_WINDOW_H_
