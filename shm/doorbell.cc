#include "shm/doorbell.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "shm/ring.h"

namespace gradlane::shm {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::StatusOr<UniqueFd> CreateEventFd() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return UniqueFd(fd);
}

bool Doorbell::NotifyIfArmed() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  auto armed = Shared(header_->armed);
  // The cheap relaxed load keeps the common case (consumer awake) free of a locked RMW; the
  // exchange makes one write per sleep rather than one per post while the consumer wakes up.
  if (armed.load(std::memory_order_relaxed) == 0) return false;
  if (armed.exchange(0, std::memory_order_acq_rel) == 0) return false;
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: the consumer will wake anyway.
  [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof(one));
  return true;
}

void Doorbell::Arm() {
  Shared(header_->armed).store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void Doorbell::Disarm() { Shared(header_->armed).store(0, std::memory_order_relaxed); }

bool Doorbell::Wait(int timeout_ms, int extra_fd, bool* extra_ready) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {extra_fd, POLLIN | POLLRDHUP, 0}};
  const int nfds = extra_fd >= 0 ? 2 : 1;
  const int r = ::poll(fds, nfds, timeout_ms);
  if (extra_ready != nullptr) *extra_ready = nfds == 2 && fds[1].revents != 0;
  if (r < 0) return errno == EINTR;
  return (fds[0].revents & POLLIN) != 0;
}

void Doorbell::Drain() {
  uint64_t v;
  while (::read(fd_, &v, sizeof(v)) == sizeof(v)) {
  }
}

}  // namespace gradlane::shm
