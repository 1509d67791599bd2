// daemon/session_server.h — the daemon's listener for client sessions: the Unix socket, the
// versioned hello, the SO_PEERCRED policy, the set of live sessions, client-death detection and
// reclamation, and a poll loop an engine thread drives.
//
// Guarantees:
// - Thread rules: every `_st` method (PollOnce_st, Wait_st, the sleep halves, FindSession_st,
//   session_count_st, Run_st) is for the one engine thread that owns the server; so is the
//   destructor (or it runs once that thread has stopped). Create, Stats(), wait_fd(),
//   socket_path(), MonotonicNow(), SetRegistrar() and Retire() may be called from any thread.
//   The acceptor thread's state is its own; the two threads share only the hand-off queue, the
//   retire queue (arena aliases the engine let go, dropped by the acceptor) and the per-uid
//   session counts (each behind its own Mutex, daemon/mutex.h, checked by clang's
//   -Wthread-safety), the registrar pointer and relaxed atomic counters.
// - Control work off the engine thread: the server runs its own acceptor thread for accepting,
//   hello validation, SO_PEERCRED checks and session creation (memfd arena, ring setup, the
//   daemon's alias of the arena and its registration with an RDMA device — the part that
//   costs milliseconds, or for verbs up to hundreds of them, for a large arena). A ready session is
//   handed to the engine thread through a locked queue and an eventfd, so a client connecting never
//   stalls the data path; the engine thread adopts it on its next control round.
// - The socket path: Create() takes it only from a dead owner. It holds an exclusive lock on
//   `<socket>.lock` (which names its pid) for its whole life and also refuses a path a live
//   process still answers on, so a second daemon never unlinks the socket of a running one;
//   its error names the pid that serves it.
// - Admission: the SO_PEERCRED credentials are checked the moment a connection is accepted; a
//   uid the AccessPolicy refuses gets GL_E_PERMISSION at once and holds nothing. Connections
//   owing their hello are bounded in all (`max_pending`) and per uid (`max_pending_per_uid`),
//   sessions in all (`max_sessions`) and per uid (`max_sessions_per_uid`); a connection over a
//   limit gets GL_E_BUSY naming the limit. Every refusal is counted by reason (Stats()).
// - Handshake: the first message must be a gl_hello of the right size, magic and ABI version;
//   otherwise the client gets a gl_hello_reply with GL_E_BAD_MAGIC / GL_E_BAD_VERSION /
//   GL_E_PROTOCOL and a readable message, and the connection is closed. A connection that says
//   nothing within `handshake_timeout` is closed.
// - Every control message on a session gets a reply, a refused one included (too long for
//   GL_MAX_CONTROL_MESSAGE, or carrying file descriptors beyond what a message may pass).
// - Death: each session is watched through a pidfd (pidfd_open of the SO_PEERCRED pid) and its
//   socket (hang-up). With PollOnce_st() called at least every `control_interval` (or Wait_st()
//   sleeping), a dead client is noticed within that interval, and its arena, ids and counters
//   are released at once. A client that corrupts its ring is disconnected (GL_MSG_GOODBYE with
//   GL_E_RING_CORRUPT); the others are untouched.
// - The data path (polling rings) makes no system call; control events are collected with one
//   non-blocking epoll_wait at most every `control_interval`.
#ifndef GRADLANE_DAEMON_SESSION_SERVER_H_
#define GRADLANE_DAEMON_SESSION_SERVER_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/arena_alias.h"
#include "daemon/mutex.h"
#include "daemon/session.h"
#include "sched/types.h"
#include "transport/transport.h"

namespace gradlane::daemon {

// Who may open a session. A peer is allowed if its uid is the daemon's own (when
// allow_same_uid), or listed, or its primary gid is listed.
struct AccessPolicy {
  bool allow_same_uid = true;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  bool Allows(uid_t uid, gid_t gid) const;
};

struct SessionServerOptions {
  std::string socket_path = GL_DEFAULT_SOCKET_PATH;
  mode_t socket_mode = 0666;  // access is decided by AccessPolicy, not by file mode
  AccessPolicy policy;
  uint64_t default_arena_bytes = uint64_t{64} << 20;
  uint64_t max_arena_bytes = uint64_t{1} << 30;
  uint32_t default_ring_slots = 1024;
  uint32_t max_ring_slots = 1u << 16;
  uint32_t max_sessions = 256;
  uint32_t max_pending = 64;  // connections still owing their hello; more are refused at once
  uint32_t max_pending_per_uid = 16;
  uint32_t max_sessions_per_uid = 64;
  sched::TimeNs control_interval = sched::kMillisecond;
  sched::TimeNs handshake_timeout = 5 * sched::kSecond;
  uint32_t poll_budget = 256;  // submissions taken per session per PollOnce_st
  // Test mode: complete every valid post at once with GL_OK (no engine behind the server).
  bool loopback_complete = false;
};

// Why a connection was turned away before it became a session.
enum class Refusal : int {
  kNotAllowed = 0,    // the AccessPolicy refuses its uid/gid
  kPendingFull,       // max_pending connections owe their hello
  kPendingPerUid,     // this uid has max_pending_per_uid connections owing their hello
  kSessionsFull,      // max_sessions sessions
  kSessionsPerUid,    // this uid has max_sessions_per_uid sessions
  kHandshakeTimeout,  // said nothing within handshake_timeout
  kBadHello,          // wrong magic, version or framing
  kNoMemory,          // its arena could not be created, mapped or registered with the device
  kCount
};
// Stable lower-case names (metric labels, gradlanectl).
const char* RefusalName(Refusal r);

// Counters, readable from any thread.
struct SessionServerStats {
  uint64_t sessions_accepted = 0;
  uint64_t sessions_active = 0;
  uint64_t sessions_closed = 0;
  uint64_t clients_died = 0;         // pidfd exit or socket hang-up
  uint64_t corrupt_disconnects = 0;  // ring headers/indices broken by the client
  uint64_t handshakes_rejected = 0;
  std::array<uint64_t, GL_STATUS_COUNT> rejected_by_status{};
  std::array<uint64_t, static_cast<int>(Refusal::kCount)> refused_by_reason{};
  uint64_t control_messages_refused = 0;  // on a session: too long, or with too many fds
  uint64_t posts_ok = 0;
  uint64_t completions = 0;
  uint64_t bad_descriptors = 0;
  std::array<uint64_t, GL_STATUS_COUNT> bad_by_status{};
  uint64_t arena_bytes_mapped = 0;  // sum over live sessions
  uint64_t tensors_registered = 0;  // live sessions' tensors
};

class SessionServer {
 public:
  // Binds the socket. `sink` receives valid posts (not owned; may be null only with
  // loopback_complete).
  static absl::StatusOr<std::unique_ptr<SessionServer>> Create(SessionServerOptions options,
                                                               PostSink* sink = nullptr);
  ~SessionServer();
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  // One round: control events (accept, handshakes, registrations, deaths) if `now` is at
  // least control_interval past the last round or Wait_st() saw activity; then every session's
  // submissions. Returns the amount of work done (0 = idle). `now` is CLOCK_MONOTONIC ns.
  int PollOnce_st(sched::TimeNs now);

  // Sleeps until a submission doorbell rings, a control event arrives or `timeout_ms` passes
  // (arming each session's doorbell per the protocol in shm/doorbell.h). Returns at once if a
  // submission is already waiting.
  void Wait_st(int timeout_ms);
  // Wait_st() in two halves, for a caller that sleeps on several fds at once (the engine: client
  // events and peer sockets): ArmForSleep_st arms every doorbell and returns false when a
  // submission is already waiting (do not sleep); it may shorten *timeout_ms. Sleep on
  // wait_fd() (readable when a control event or a doorbell is pending), then DisarmAfterSleep_st
  // with whether it fired. Always pair the two.
  bool ArmForSleep_st(int* timeout_ms);
  void DisarmAfterSleep_st(bool woke);
  int wait_fd() const { return epoll_.get(); }  // any thread (fixed at creation)

  // Convenience loop for tests and tools: PollOnce_st + Wait_st(idle_ms) until `stop` is set.
  // The calling thread is the server's engine thread while it runs.
  void Run_st(const std::atomic<bool>& stop, int idle_ms = 5);

  SessionServerStats Stats() const;  // any thread

  // Any thread, before clients connect (sessions set up earlier are not registered ahead, and
  // their arena is registered by the engine when a job starts): the transport's registrar,
  // with which the acceptor thread registers each new session's arena alias. It must outlive
  // the server. Null (the default): nothing to register.
  void SetRegistrar(transport::MemoryRegistrar* registrar);
  // Whether the transport sends from GPU memory (TransportCapabilities::device_memory): a
  // client's GL_MSG_ATTACH_DEVICE is refused at once where it cannot.
  void SetDeviceMemory(bool supported);
  // Any thread: drops `alias` on the acceptor thread (the engine's last reference to an arena:
  // its deregistration and unmapping stay off the data path). After the server is destroyed,
  // nobody may call it.
  void Retire(std::shared_ptr<ArenaAlias> alias) ABSL_LOCKS_EXCLUDED(retire_mu_);
  Session* FindSession_st(uint64_t id);
  size_t session_count_st() const { return sessions_.size(); }
  const std::string& socket_path() const { return options_.socket_path; }

  static sched::TimeNs MonotonicNow();

 private:
  struct Pending;
  struct Live;
  class LoopbackSink;

  SessionServer(SessionServerOptions options, PostSink* sink, shm::UniqueFd listener,
                shm::UniqueFd epoll);
  int PollControl_st(sched::TimeNs now);
  void AdoptHandedOff_st() ABSL_LOCKS_EXCLUDED(handoff_mu_);
  // Acceptor thread (not the engine's, so no `_st`: these touch only the acceptor's own state,
  // the hand-off queue under handoff_mu_, and atomics).
  void AcceptorLoop();
  void AcceptorWatch(int fd, uint64_t token, uint32_t events);
  // False when accept failed for a reason other than an empty backlog (EMFILE, ENOMEM).
  bool AcceptAll(sched::TimeNs now);
  void HandlePending(uint64_t token, std::vector<uint8_t>& rx_buf) ABSL_LOCKS_EXCLUDED(handoff_mu_);
  // The acceptor thread (or the destructor, once it has stopped): drops the retired aliases.
  void DropRetired() ABSL_LOCKS_EXCLUDED(retire_mu_);
  // Sends a gl_hello_reply with `status` and `why` on `fd` (best effort) and counts it.
  void RejectHandshake(int fd, uint64_t request_id, gl_status status, Refusal reason,
                       const std::string& why);
  // Removes pending_[i] (swap with the last), releasing its uid's pending count.
  void DropPending(size_t i);
  // A connection refused at accept: kept (one fd, no pending slot) until its hello is read or
  // it hangs up, so that closing it does not reset away the reply.
  void HoldRefused(shm::UniqueFd socket, sched::TimeNs now);
  void FinishRefused(uint64_t token);
  // Per-uid session counts: taken by the acceptor, released by the acceptor (a session it could
  // not start) or the engine thread (a session closed).
  bool TakeSessionSlot(uid_t uid) ABSL_LOCKS_EXCLUDED(uid_sessions_mu_);
  void ReleaseSessionSlot(uid_t uid) ABSL_LOCKS_EXCLUDED(uid_sessions_mu_);
  void HandleSessionSocket_st(uint64_t session_id, uint32_t events);
  void CloseSession_st(uint64_t session_id, gl_status reason, const std::string& why)
      ABSL_LOCKS_EXCLUDED(uid_sessions_mu_);
  void Publish_st();
  // Registration in the engine's epoll set: epoll_ctl on a descriptor fixed at creation, so
  // any thread (Create registers the hand-off eventfd before the engine thread runs).
  void Watch(int fd, uint64_t token, uint32_t events);
  void Unwatch(int fd);

  SessionServerOptions options_;
  shm::UniqueFd path_lock_;  // flock'ed <socket>.lock: this server owns the socket path
  PostSink* sink_;
  std::unique_ptr<LoopbackSink> loopback_;
  shm::UniqueFd listener_;
  shm::UniqueFd epoll_;
  std::vector<std::unique_ptr<Live>> sessions_;  // engine thread
  std::atomic<uint64_t> next_id_{1};  // session ids and acceptor tokens (acceptor thread)

  // Acceptor thread: its epoll (listener, hello-pending sockets, stop), the connections owing
  // a hello (its alone), and the hand-off of ready sessions to the engine thread.
  std::thread acceptor_;
  shm::UniqueFd acceptor_epoll_;
  shm::UniqueFd stop_fd_;
  std::vector<std::unique_ptr<Pending>> pending_;  // acceptor thread only
  struct Refused {
    uint64_t token;
    shm::UniqueFd socket;
    sched::TimeNs deadline;
  };
  std::vector<Refused> refused_;                          // acceptor thread only
  absl::flat_hash_map<uid_t, uint32_t> pending_per_uid_;  // acceptor thread only
  Mutex uid_sessions_mu_;
  absl::flat_hash_map<uid_t, uint32_t> sessions_per_uid_ ABSL_GUARDED_BY(uid_sessions_mu_);
  Mutex handoff_mu_;
  std::vector<std::unique_ptr<Live>> handoff_ ABSL_GUARDED_BY(handoff_mu_);
  shm::UniqueFd handoff_fd_;  // eventfd in epoll_: sessions wait in handoff_
  // Arena aliases whose last reference the engine thread gave up, for the acceptor to drop.
  Mutex retire_mu_;
  std::vector<std::shared_ptr<ArenaAlias>> retired_ ABSL_GUARDED_BY(retire_mu_);
  shm::UniqueFd retire_fd_;  // eventfd in acceptor_epoll_: aliases wait in retired_
  std::atomic<transport::MemoryRegistrar*> registrar_{nullptr};
  std::atomic<bool> device_memory_{false};
  // Counters shared without a lock (atomics, relaxed: each is a count of its own; Stats() reads
  // them from any thread). live_sessions_: raised by the acceptor (a session handed off),
  // lowered by the engine thread (a session closed), checked by the acceptor against
  // max_sessions. sessions_accepted_ to refused_by_reason_: the acceptor's.
  // control_messages_refused_: the engine thread's.
  std::atomic<uint32_t> live_sessions_{0};  // adopted + handed off (max_sessions)
  std::atomic<uint64_t> sessions_accepted_{0};
  std::atomic<uint64_t> handshakes_rejected_{0};
  std::array<std::atomic<uint64_t>, GL_STATUS_COUNT> rejected_by_status_{};
  std::array<std::atomic<uint64_t>, static_cast<int>(Refusal::kCount)> refused_by_reason_{};
  std::atomic<uint64_t> control_messages_refused_{0};
  // Engine thread only.
  sched::TimeNs last_control_ = 0;
  bool control_pending_ = true;
  std::vector<uint8_t> rx_buf_;  // control messages (allocated once)

  // Engine-thread totals, copied by Publish_st() into the atomics below, which the engine thread
  // alone writes and Stats() reads from any thread (relaxed; tensors_published_ last, release).
  SessionServerStats totals_;
  std::array<std::atomic<uint64_t>, 10> published_{};
  std::array<std::atomic<uint64_t>, GL_STATUS_COUNT> published_bad_{};
  std::atomic<uint64_t> tensors_published_{0};
};

}  // namespace gradlane::daemon

#endif  // GRADLANE_DAEMON_SESSION_SERVER_H_
