// shm/doorbell.h — the wake-up half of a ring: an eventfd plus the consumer's `armed` flag in
// the shared ring header (gl_ring_header::armed).
//
// Protocol (no lost wake-up, no system call while the consumer is awake):
//   consumer, ring looks empty:  Arm()  [armed = 1; full fence]
//                                re-check the ring; if not empty: Disarm() and go on;
//                                else Wait(timeout) [poll on the eventfd], Drain(), Disarm().
//   producer, after publishing:  NotifyIfArmed()  [full fence; if armed: armed = 0, write].
// The two full fences order "store mark/index, load armed" against "store armed, load ring":
// in every interleaving at least one side sees the other's store, so either the consumer's
// re-check finds the entry or the producer sees the flag and writes the eventfd. The eventfd
// counts, so a write that lands before the consumer blocks is not lost.
//
// Thread rules: a Doorbell object is used by one side (one thread) of one ring. It does not
// own the ring header; DoorbellFd owns the eventfd. The armed flag may be scribbled on by a
// hostile peer: the worst outcome is a spurious eventfd write or a wake-up that the timeout
// covers, never a crash or a block (the fd is non-blocking for writes).
#ifndef GRADLANE_SHM_DOORBELL_H_
#define GRADLANE_SHM_DOORBELL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "shm/abi.h"

namespace gradlane::shm {

// An owned file descriptor (closed on destruction). Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A non-blocking, close-on-exec eventfd.
absl::StatusOr<UniqueFd> CreateEventFd();

class Doorbell {
 public:
  Doorbell() = default;
  // `header` is the ring's shared header; `fd` an eventfd (not owned).
  Doorbell(gl_ring_header* header, int fd) : header_(header), fd_(fd) {}

  // Producer side, after publishing entries. Makes a system call only if the consumer armed.
  // Returns true if it wrote the eventfd.
  bool NotifyIfArmed();

  // Consumer side.
  void Arm();
  void Disarm();
  // Blocks until the eventfd is readable or `timeout_ms` passes (-1 = forever). Also returns
  // early if `extra_fd` (>= 0) becomes readable or hangs up (the daemon's socket, so a client
  // waiting for completions notices the daemon going away). Returns true when woken by the
  // doorbell, false on timeout or extra_fd activity. EINTR counts as a wake-up.
  bool Wait(int timeout_ms, int extra_fd = -1, bool* extra_ready = nullptr);
  // Empties the eventfd counter (non-blocking).
  void Drain();

  int fd() const { return fd_; }

 private:
  gl_ring_header* header_ = nullptr;
  int fd_ = -1;
};

}  // namespace gradlane::shm

#endif  // GRADLANE_SHM_DOORBELL_H_
