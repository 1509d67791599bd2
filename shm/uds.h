// shm/uds.h — Unix-domain SOCK_SEQPACKET helpers for the session control path: listen,
// connect, one message per send with optional fds (SCM_RIGHTS), peer credentials.
//
// Guarantees:
// - SOCK_SEQPACKET keeps message boundaries, so a control message is never split or merged;
//   a message larger than the receive buffer is reported as an error, not truncated silently.
// - Every fd created here is close-on-exec. Received fds beyond what the caller asked for, or
//   arriving with a truncated control block, are closed, never leaked.
// - Functions are thread-compatible (no shared state); the fds are the caller's.
#ifndef GRADLANE_SHM_UDS_H_
#define GRADLANE_SHM_UDS_H_

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/doorbell.h"

namespace gradlane::shm {

inline constexpr size_t kMaxPassedFds = 4;

// Claims `path` for a listener before ListenUnix may replace it: takes an exclusive flock on
// `<path>.lock` (created if missing), writes our pid into it, and refuses a socket file a live
// process still answers on (one that took no lock). The claim lasts while the returned fd is
// open; a lock file removed by its owner before it let go is not a claim (checked by inode).
// AlreadyExists when another process owns the path; the message names its pid.
absl::StatusOr<UniqueFd> ClaimSocketPath(const std::string& path);
// Ends a claim: removes the socket file and the lock file while still holding the lock, then
// lets go. A process that dies without it leaves both; the next claim takes them over.
void ReleaseSocketPath(const std::string& path, UniqueFd lock);

// Binds and listens on `path` (non-blocking). Creates the parent directory if missing and
// replaces a stale socket file; refuses to replace anything that is not a socket. Call it
// with the path claimed (ClaimSocketPath), or it may unlink a live listener's socket.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode = 0666);

// Connects (blocking) to the socket at `path`.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path);

// Sends one message with up to kMaxPassedFds fds. Blocking sockets block; a non-blocking one
// returns Unavailable on EAGAIN.
absl::Status SendMessage(int sock, const void* data, size_t len, std::span<const int> fds = {});

struct Received {
  size_t bytes = 0;  // 0 with eof = true: the peer closed
  bool eof = false;
  size_t num_fds = 0;  // fds stored into the caller's array (owned by the caller)
};

// Receives one message into `buf`. Unavailable on EAGAIN (non-blocking socket);
// OutOfRange if the message did not fit (it is discarded).
absl::StatusOr<Received> ReceiveMessage(int sock, void* buf, size_t cap,
                                        std::span<UniqueFd> fds = {});

// Waits up to `timeout_ms` for `sock` to be readable (-1 = forever). DeadlineExceeded on timeout.
absl::Status WaitReadable(int sock, int timeout_ms);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int sock);

}  // namespace gradlane::shm

#endif  // GRADLANE_SHM_UDS_H_
