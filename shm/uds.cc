#include "shm/uds.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradlane::shm {
namespace {

absl::Status Errno(const std::string& what) {
  const int e = errno;
  if (e == EAGAIN || e == EWOULDBLOCK)
    return absl::UnavailableError(absl::StrCat(what, ": would block"));
  if (e == EACCES || e == EPERM)
    return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(e)));
  if (e == ENOENT || e == ECONNREFUSED)
    return absl::NotFoundError(absl::StrCat(what, ": ", std::strerror(e)));
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(e)));
}

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

absl::Status MakeParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Errno(absl::StrCat("mkdir ", dir));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueFd> ClaimSocketPath(const std::string& path) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  if (absl::Status s = MakeParentDir(path); !s.ok()) return s;
  const std::string lock_path = path + ".lock";
  UniqueFd lock;
  for (int attempt = 0;; ++attempt) {
    lock.Reset(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!lock.valid()) return Errno(absl::StrCat("open ", lock_path));
    if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return Errno(absl::StrCat("flock ", lock_path));
      char pid[32] = {};
      const ssize_t n = ::pread(lock.get(), pid, sizeof(pid) - 1, 0);
      std::string owner = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "";
      while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
      return absl::AlreadyExistsError(
          absl::StrCat(path, " is served by gradlaned pid ", owner.empty() ? "(unknown)" : owner,
                       " (it holds ", lock_path, "): stop that daemon or choose another --socket"));
    }
    // The owner removes the file while it still holds the lock (ReleaseSocketPath): a lock
    // taken on a file no longer at lock_path is no claim. Look again.
    struct stat held, named;
    if (::fstat(lock.get(), &held) == 0 && ::stat(lock_path.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      break;
    }
    if (attempt == 8) return absl::UnavailableError(absl::StrCat(lock_path, " keeps changing"));
  }
  // A listener that took no lock (an older daemon, another program) still answers a connect.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (probe.valid() &&
        (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0 ||
         errno == EAGAIN)) {
      auto cred = GetPeerCredentials(probe.get());
      return absl::AlreadyExistsError(absl::StrCat(
          path, " is served by pid ", cred.ok() ? absl::StrCat(cred->pid) : "(unknown)",
          ", which holds no lock on ", lock_path, ": stop it or choose another --socket"));
    }
  }
  const std::string me = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(lock.get(), 0) != 0 || ::pwrite(lock.get(), me.data(), me.size(), 0) < 0) {
    return Errno(absl::StrCat("write ", lock_path));
  }
  return lock;
}

void ReleaseSocketPath(const std::string& path, UniqueFd lock) {
  if (!lock.valid()) return;
  ::unlink(path.c_str());
  ::unlink((path + ".lock").c_str());
  lock.Reset();  // only now may the next claimant lock a (new) file
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  if (absl::Status s = MakeParentDir(path); !s.ok()) return s;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(absl::StrCat(path, " exists and is not a socket"));
    }
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket");
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("bind ", path));
  }
  if (::chmod(path.c_str(), mode) != 0) return Errno(absl::StrCat("chmod ", path));
  if (::listen(fd.get(), 128) != 0) return Errno("listen");
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket");
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    if (errno == EINTR) continue;
    return Errno(absl::StrCat("connect ", path));
  }
  return fd;
}

absl::Status SendMessage(int sock, const void* data, size_t len, std::span<const int> fds) {
  if (fds.size() > kMaxPassedFds) return absl::InvalidArgumentError("too many fds");
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      if (static_cast<size_t>(n) != len) return absl::InternalError("short send on SOCK_SEQPACKET");
      return absl::OkStatus();
    }
    if (errno == EINTR) continue;
    return Errno("sendmsg");
  }
}

absl::StatusOr<Received> ReceiveMessage(int sock, void* buf, size_t cap, std::span<UniqueFd> fds) {
  iovec iov{buf, cap};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    return Errno("recvmsg");
  }
  Received r;
  // Take ownership of every fd that arrived before deciding anything, so none leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (r.num_fds < fds.size()) {
        fds[r.num_fds++].Reset(fd);
      } else {
        ::close(fd);
      }
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    for (size_t i = 0; i < r.num_fds; ++i) fds[i].Reset();
    return absl::OutOfRangeError("control data truncated (too many fds)");
  }
  if ((msg.msg_flags & MSG_TRUNC) != 0) {
    for (size_t i = 0; i < r.num_fds; ++i) fds[i].Reset();
    return absl::OutOfRangeError(absl::StrCat("message longer than ", cap, " bytes"));
  }
  r.bytes = static_cast<size_t>(n);
  r.eof = n == 0;
  return r;
}

absl::Status WaitReadable(int sock, int timeout_ms) {
  pollfd p{sock, POLLIN, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return absl::OkStatus();
    if (r == 0) return absl::DeadlineExceededError("timed out waiting for the daemon");
    if (errno != EINTR) return Errno("poll");
  }
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

}  // namespace gradlane::shm
