#include "daemon/session_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/session_hello.h"

namespace gradlane::daemon {
namespace {

enum Kind : uint64_t {
  kListener = 1,
  kPending = 2,
  kSocket = 3,
  kPidfd = 4,
  kDoorbell = 5,
  kHandoff = 6,
  kStop = 7,
  kRefused = 8,
  kRetire = 9
};
// A connection refused at accept gets its reply at once, but is closed only once its hello
// (sent right after connect) has been read or it hung up: closing a Unix socket with unread
// input resets it, and the reset would swallow the reply. Held at most this long, and at most
// kMaxRefusedHeld at a time (the oldest is closed first); each costs one fd, no pending slot.
constexpr sched::TimeNs kRefusedLinger = sched::kSecond;
constexpr size_t kMaxRefusedHeld = 256;
constexpr int kKindShift = 56;
constexpr uint64_t Token(Kind k, uint64_t id) { return (uint64_t{k} << kKindShift) | id; }
constexpr Kind TokenKind(uint64_t t) { return static_cast<Kind>(t >> kKindShift); }
constexpr uint64_t TokenId(uint64_t t) { return t & ((uint64_t{1} << kKindShift) - 1); }

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

void CopyMessage(char (&dst)[GL_MESSAGE_TEXT], const std::string& msg) {
  const size_t n = std::min<size_t>(msg.size(), GL_MESSAGE_TEXT - 1);
  std::memcpy(dst, msg.data(), n);
  dst[n] = '\0';
}

}  // namespace

const char* RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kNotAllowed:
      return "not_allowed";
    case Refusal::kPendingFull:
      return "pending_limit";
    case Refusal::kPendingPerUid:
      return "pending_per_uid_limit";
    case Refusal::kSessionsFull:
      return "session_limit";
    case Refusal::kSessionsPerUid:
      return "sessions_per_uid_limit";
    case Refusal::kHandshakeTimeout:
      return "handshake_timeout";
    case Refusal::kBadHello:
      return "bad_hello";
    case Refusal::kNoMemory:
      return "no_memory";
    case Refusal::kCount:
      break;
  }
  return "unknown";
}

bool AccessPolicy::Allows(uid_t uid, gid_t gid) const {
  if (allow_same_uid && uid == ::geteuid()) return true;
  if (std::find(uids.begin(), uids.end(), uid) != uids.end()) return true;
  return std::find(gids.begin(), gids.end(), gid) != gids.end();
}

struct SessionServer::Pending {
  uint64_t token;
  shm::UniqueFd socket;
  sched::TimeNs deadline;
  shm::PeerCredentials cred;  // read at accept: admission is decided before the hello
};

struct SessionServer::Live {
  std::unique_ptr<Session> session;
  shm::UniqueFd pidfd;  // invalid when pidfd_open is unavailable: the socket hang-up covers it
};

class SessionServer::LoopbackSink : public PostSink {
 public:
  void OnPost_st(Session& session, const PostDescriptor& post) override {
    // Cannot fail: PollSubmissions_st reserved the slot. A corrupt ring shows up on the next poll.
    (void)session.Complete_st(post, GL_OK);
  }
};

sched::TimeNs SessionServer::MonotonicNow() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return sched::TimeNs{ts.tv_sec} * sched::kSecond + ts.tv_nsec;
}

absl::StatusOr<std::unique_ptr<SessionServer>> SessionServer::Create(SessionServerOptions options,
                                                                     PostSink* sink) {
  if (sink == nullptr && !options.loopback_complete) {
    return absl::InvalidArgumentError("a PostSink is required unless loopback_complete is set");
  }
  if (!shm::IsPowerOfTwo(options.default_ring_slots) ||
      !shm::IsPowerOfTwo(options.max_ring_slots) ||
      options.default_ring_slots > options.max_ring_slots) {
    return absl::InvalidArgumentError("ring slot limits must be powers of two, default <= max");
  }
  if (options.default_arena_bytes > options.max_arena_bytes) {
    return absl::InvalidArgumentError("default arena size above the maximum");
  }
  // Claimed first: the listener replaces the socket file, which must never be a live daemon's.
  auto claim = shm::ClaimSocketPath(options.socket_path);
  if (!claim.ok()) return claim.status();
  auto listener = shm::ListenUnix(options.socket_path, options.socket_mode);
  if (!listener.ok()) return listener.status();
  shm::UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  shm::UniqueFd acceptor_ep(::epoll_create1(EPOLL_CLOEXEC));
  shm::UniqueFd handoff(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  shm::UniqueFd stop(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  shm::UniqueFd retire(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!ep.valid() || !acceptor_ep.valid() || !handoff.valid() || !stop.valid() || !retire.valid()) {
    const int err = errno;
    shm::ReleaseSocketPath(options.socket_path, std::move(*claim));
    return absl::InternalError(absl::StrCat("epoll/eventfd: ", std::strerror(err)));
  }
  auto server = std::unique_ptr<SessionServer>(
      new SessionServer(std::move(options), sink, std::move(*listener), std::move(ep)));
  server->path_lock_ = std::move(*claim);
  server->acceptor_epoll_ = std::move(acceptor_ep);
  server->handoff_fd_ = std::move(handoff);
  server->stop_fd_ = std::move(stop);
  server->retire_fd_ = std::move(retire);
  server->Watch(server->handoff_fd_.get(), Token(kHandoff, 0), EPOLLIN);
  server->AcceptorWatch(server->listener_.get(), Token(kListener, 0), EPOLLIN);
  server->AcceptorWatch(server->stop_fd_.get(), Token(kStop, 0), EPOLLIN);
  server->AcceptorWatch(server->retire_fd_.get(), Token(kRetire, 0), EPOLLIN);
  SessionServer* raw = server.get();
  server->acceptor_ = std::thread([raw] { raw->AcceptorLoop(); });
  return server;
}

SessionServer::SessionServer(SessionServerOptions options, PostSink* sink, shm::UniqueFd listener,
                             shm::UniqueFd epoll)
    : options_(std::move(options)),
      sink_(sink),
      listener_(std::move(listener)),
      epoll_(std::move(epoll)),
      rx_buf_(GL_MAX_CONTROL_MESSAGE) {
  if (sink_ == nullptr) {
    loopback_ = std::make_unique<LoopbackSink>();
    sink_ = loopback_.get();
  }
}

SessionServer::~SessionServer() {
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
    acceptor_.join();
  }
  {
    // Handed over but never adopted: closing their sockets tells those clients.
    MutexLock lock(&handoff_mu_);
    handoff_.clear();
  }
  while (!sessions_.empty()) {
    CloseSession_st(sessions_.back()->session->id(), GL_E_DISCONNECTED, "daemon shutting down");
  }
  // The acceptor is gone: what was retired since (the sessions just closed) is dropped here.
  DropRetired();
  shm::ReleaseSocketPath(options_.socket_path, std::move(path_lock_));
}

void SessionServer::SetRegistrar(transport::MemoryRegistrar* registrar) {
  registrar_.store(registrar, std::memory_order_release);
}

void SessionServer::SetDeviceMemory(bool supported) {
  device_memory_.store(supported, std::memory_order_release);
}

void SessionServer::Retire(std::shared_ptr<ArenaAlias> alias) {
  if (alias == nullptr) return;
  {
    MutexLock lock(&retire_mu_);
    retired_.push_back(std::move(alias));
  }
  const uint64_t one = 1;
  (void)!::write(retire_fd_.get(), &one, sizeof(one));
}

void SessionServer::DropRetired() {
  uint64_t count = 0;
  (void)!::read(retire_fd_.get(), &count, sizeof(count));
  std::vector<std::shared_ptr<ArenaAlias>> retired;
  {
    MutexLock lock(&retire_mu_);
    retired.swap(retired_);
  }
  // Outside the lock: the last reference unpins (deregistering a GiB takes a while) and unmaps.
  retired.clear();
}

void SessionServer::Watch(int fd, uint64_t token, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void SessionServer::AcceptorWatch(int fd, uint64_t token, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  ::epoll_ctl(acceptor_epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
}

void SessionServer::Unwatch(int fd) {
  // Explicit: the client holds references to the same open files (doorbell), so closing our
  // fd would not remove the registration.
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

Session* SessionServer::FindSession_st(uint64_t id) {
  for (auto& l : sessions_) {
    if (l->session->id() == id) return l->session.get();
  }
  return nullptr;
}

int SessionServer::PollOnce_st(sched::TimeNs now) {
  int work = 0;
  if (control_pending_ || now - last_control_ >= options_.control_interval) {
    work += PollControl_st(now);
  }
  for (size_t i = 0; i < sessions_.size();) {
    Session& s = *sessions_[i]->session;
    bool corrupt = false;
    work += static_cast<int>(s.PollSubmissions_st(sink_, options_.poll_budget, &corrupt));
    s.FlushCompletions_st();
    if (corrupt) {
      ++totals_.corrupt_disconnects;
      CloseSession_st(s.id(), GL_E_RING_CORRUPT,
                      "ring header or index inconsistent: the client corrupted shared memory");
      work += 1;
      continue;  // sessions_[i] now holds another session
    }
    ++i;
  }
  if (work > 0) Publish_st();
  return work;
}

int SessionServer::PollControl_st(sched::TimeNs now) {
  last_control_ = now;
  control_pending_ = false;
  int work = 0;
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_.get(), events, 64, 0);
  for (int i = 0; i < n; ++i) {
    const uint64_t t = events[i].data.u64;
    ++work;
    switch (TokenKind(t)) {
      case kHandoff:
        AdoptHandedOff_st();
        break;
      case kListener:
      case kPending:
      case kStop:
      case kRefused:
      case kRetire:
        break;  // the acceptor thread's
      case kSocket:
        HandleSessionSocket_st(TokenId(t), events[i].events);
        break;
      case kPidfd:
        if (FindSession_st(TokenId(t)) != nullptr) {
          ++totals_.clients_died;
          CloseSession_st(TokenId(t), GL_E_DISCONNECTED, "client process exited");
        }
        break;
      case kDoorbell:
        if (Session* s = FindSession_st(TokenId(t))) s->DrainSubmissionDoorbell_st();
        --work;  // a wake-up, not work: the ring poll counts the descriptors
        break;
    }
  }
  if (n == 64) control_pending_ = true;  // more may be waiting
  if (work > 0) Publish_st();
  return work;
}

void SessionServer::AdoptHandedOff_st() {
  uint64_t count = 0;
  (void)!::read(handoff_fd_.get(), &count, sizeof(count));
  std::vector<std::unique_ptr<Live>> ready;
  {
    MutexLock lock(&handoff_mu_);
    ready.swap(handoff_);
  }
  for (auto& live : ready) {
    Session& sess = *live->session;
    const uint64_t id = sess.id();
    // Level-triggered: whatever the client sent or rang before adoption fires right away.
    Watch(sess.socket_fd(), Token(kSocket, id), EPOLLIN | EPOLLRDHUP);
    Watch(sess.sq_doorbell_fd(), Token(kDoorbell, id), EPOLLIN);
    if (live->pidfd.valid()) Watch(live->pidfd.get(), Token(kPidfd, id), EPOLLIN);
    sessions_.push_back(std::move(live));
  }
  control_pending_ = true;
}

// ------------------------------------------------------------------ acceptor thread ----

void SessionServer::AcceptorLoop() {
  std::vector<uint8_t> rx(GL_MAX_CONTROL_MESSAGE);
  for (;;) {
    // Sleep until an event or the earliest hello (or refusal linger) deadline.
    sched::TimeNs now = MonotonicNow();
    int timeout_ms = -1;
    auto until = [&](sched::TimeNs deadline) {
      const sched::TimeNs left = deadline > now ? deadline - now : 0;
      const int ms =
          static_cast<int>(std::min<sched::TimeNs>(left / sched::kMillisecond + 1, 60000));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    for (const auto& p : pending_) until(p->deadline);
    for (const Refused& r : refused_) until(r.deadline);
    epoll_event events[16];
    const int n = ::epoll_wait(acceptor_epoll_.get(), events, 16, timeout_ms);
    now = MonotonicNow();
    for (int i = 0; i < n; ++i) {
      const uint64_t t = events[i].data.u64;
      switch (TokenKind(t)) {
        case kStop:
          while (!pending_.empty()) DropPending(pending_.size() - 1);
          refused_.clear();
          return;
        case kRefused:
          FinishRefused(TokenId(t));
          break;
        case kListener:
          if (!AcceptAll(now)) {
            // Out of descriptors or memory: the backlog keeps the clients waiting meanwhile.
            ::usleep(10000);
          }
          break;
        case kPending:
          HandlePending(TokenId(t), rx);
          break;
        case kRetire:
          DropRetired();
          break;
        default:
          break;
      }
    }
    for (size_t i = 0; i < refused_.size();) {
      if (now >= refused_[i].deadline) {
        refused_[i] = std::move(refused_.back());
        refused_.pop_back();
        continue;
      }
      ++i;
    }
    // Connections that never said hello.
    for (size_t i = 0; i < pending_.size();) {
      if (now >= pending_[i]->deadline) {
        RejectHandshake(pending_[i]->socket.get(), 0, GL_E_TIMEOUT, Refusal::kHandshakeTimeout,
                        "no hello within the handshake timeout");
        DropPending(i);
        continue;
      }
      ++i;
    }
  }
}

bool SessionServer::AcceptAll(sched::TimeNs now) {
  for (;;) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // EAGAIN: drained. Anything else (out of descriptors, out of memory) leaves the listener
      // readable: the caller must pause, or the acceptor thread would spin on it.
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED;
    }
    shm::UniqueFd socket(fd);
    // Admission before the hello: the kernel vouches for the credentials at connect time, so a
    // refused user never holds a pending slot, and a busy daemon says why instead of vanishing.
    auto refuse = [&](gl_status status, Refusal reason, const std::string& why) {
      RejectHandshake(fd, 0, status, reason, why);
      HoldRefused(std::move(socket), now);
    };
    auto cred = shm::GetPeerCredentials(fd);
    if (!cred.ok()) {
      refuse(GL_E_IO, Refusal::kBadHello, std::string(cred.status().message()));
      continue;
    }
    if (!options_.policy.Allows(cred->uid, cred->gid)) {
      refuse(GL_E_PERMISSION, Refusal::kNotAllowed,
             absl::StrCat("uid ", cred->uid, " gid ", cred->gid,
                          " is not allowed to use this daemon"));
      continue;
    }
    const auto mine = pending_per_uid_.find(cred->uid);
    const uint32_t held = mine == pending_per_uid_.end() ? 0 : mine->second;
    if (held >= options_.max_pending_per_uid) {
      refuse(GL_E_BUSY, Refusal::kPendingPerUid,
             absl::StrCat("uid ", cred->uid, " already has ", held,
                          " connections waiting to say hello (limit ", options_.max_pending_per_uid,
                          ", --max_pending_per_uid)"));
      continue;
    }
    if (pending_.size() >= options_.max_pending) {
      refuse(GL_E_BUSY, Refusal::kPendingFull,
             absl::StrCat(pending_.size(), " connections are waiting to say hello (limit ",
                          options_.max_pending, ", --max_pending_connections)"));
      continue;
    }
    ++pending_per_uid_[cred->uid];
    auto p = std::make_unique<Pending>();
    p->token = next_id_.fetch_add(1, std::memory_order_relaxed);
    p->socket = std::move(socket);
    p->deadline = now + options_.handshake_timeout;
    p->cred = *cred;
    AcceptorWatch(fd, Token(kPending, p->token), EPOLLIN | EPOLLRDHUP);
    pending_.push_back(std::move(p));
  }
}

void SessionServer::HoldRefused(shm::UniqueFd socket, sched::TimeNs now) {
  if (refused_.size() >= kMaxRefusedHeld) {
    auto oldest =
        std::min_element(refused_.begin(), refused_.end(), [](const Refused& a, const Refused& b) {
          return a.deadline < b.deadline;
        });
    *oldest = std::move(refused_.back());
    refused_.pop_back();
  }
  const uint64_t token = next_id_.fetch_add(1, std::memory_order_relaxed);
  AcceptorWatch(socket.get(), Token(kRefused, token), EPOLLIN | EPOLLRDHUP);
  refused_.push_back(Refused{token, std::move(socket), now + kRefusedLinger});
}

void SessionServer::FinishRefused(uint64_t token) {
  auto it = std::find_if(refused_.begin(), refused_.end(),
                         [&](const Refused& r) { return r.token == token; });
  if (it == refused_.end()) return;
  // Read what the client sent (its hello) so that closing does not reset the connection.
  char sink[512];
  while (::recv(it->socket.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
  *it = std::move(refused_.back());
  refused_.pop_back();  // closes it: the client reads its reply, then end of file
}

void SessionServer::DropPending(size_t i) {
  Pending& p = *pending_[i];
  if (p.socket.valid()) ::epoll_ctl(acceptor_epoll_.get(), EPOLL_CTL_DEL, p.socket.get(), nullptr);
  auto it = pending_per_uid_.find(p.cred.uid);
  if (it != pending_per_uid_.end() && --it->second == 0) pending_per_uid_.erase(it);
  pending_[i] = std::move(pending_.back());
  pending_.pop_back();
}

bool SessionServer::TakeSessionSlot(uid_t uid) {
  MutexLock lock(&uid_sessions_mu_);
  uint32_t& n = sessions_per_uid_[uid];
  if (n >= options_.max_sessions_per_uid) return false;
  ++n;
  return true;
}

void SessionServer::ReleaseSessionSlot(uid_t uid) {
  MutexLock lock(&uid_sessions_mu_);
  auto it = sessions_per_uid_.find(uid);
  if (it != sessions_per_uid_.end() && --it->second == 0) sessions_per_uid_.erase(it);
}

void SessionServer::RejectHandshake(int fd, uint64_t request_id, gl_status status, Refusal reason,
                                    const std::string& why) {
  gl_hello_reply r{};
  r.header.type = GL_MSG_HELLO_REPLY;
  r.header.length = sizeof(r);
  r.header.request_id = request_id;
  r.status = status;
  r.abi_version = GL_ABI_VERSION;
  CopyMessage(r.message, why);
  (void)shm::SendMessage(fd, &r, sizeof(r));
  handshakes_rejected_.fetch_add(1, std::memory_order_relaxed);
  rejected_by_status_[status].fetch_add(1, std::memory_order_relaxed);
  refused_by_reason_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
}

void SessionServer::HandlePending(uint64_t token, std::vector<uint8_t>& rx_buf) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const auto& p) { return p->token == token; });
  if (it == pending_.end()) return;
  auto p = std::make_unique<Pending>();
  std::swap(p, *it);
  DropPending(static_cast<size_t>(it - pending_.begin()));  // releases the uid's pending slot

  std::array<shm::UniqueFd, shm::kMaxPassedFds> stray;  // a hello carries no fds: dropped
  auto rx = shm::ReceiveMessage(p->socket.get(), rx_buf.data(), rx_buf.size(), stray);
  if (!rx.ok()) {
    if (absl::IsUnavailable(rx.status())) {  // spurious wake-up: keep waiting
      ++pending_per_uid_[p->cred.uid];
      AcceptorWatch(p->socket.get(), Token(kPending, p->token), EPOLLIN | EPOLLRDHUP);
      pending_.push_back(std::move(p));
      return;
    }
    RejectHandshake(p->socket.get(), 0, GL_E_PROTOCOL, Refusal::kBadHello,
                    std::string(rx.status().message()));
    return;
  }
  if (rx->eof) return;  // connected and left
  HelloLimits limits;
  limits.default_ring_slots = options_.default_ring_slots;
  limits.max_ring_slots = options_.max_ring_slots;
  limits.default_arena_bytes = options_.default_arena_bytes;
  limits.max_arena_bytes = options_.max_arena_bytes;
  const HelloCheck hello = CheckHello(std::span<const uint8_t>(rx_buf.data(), rx->bytes), limits);
  if (hello.status != GL_OK) {
    RejectHandshake(p->socket.get(), hello.request_id, hello.status, Refusal::kBadHello, hello.why);
    return;
  }
  const shm::PeerCredentials* cred = &p->cred;  // checked against the policy at accept
  if (live_sessions_.load(std::memory_order_relaxed) >= options_.max_sessions) {
    RejectHandshake(p->socket.get(), hello.request_id, GL_E_BUSY, Refusal::kSessionsFull,
                    absl::StrCat("session limit (", options_.max_sessions,
                                 ", --max_sessions) reached"));
    return;
  }
  if (!TakeSessionSlot(cred->uid)) {
    RejectHandshake(p->socket.get(), hello.request_id, GL_E_BUSY, Refusal::kSessionsPerUid,
                    absl::StrCat("uid ", cred->uid, " already has ", options_.max_sessions_per_uid,
                                 " sessions (limit --max_sessions_per_uid)"));
    return;
  }
  const uint32_t slots = hello.ring_slots;
  const uint64_t bytes = hello.arena_bytes;

  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  const int fd = p->socket.get();
  auto session = Session::Create(id, std::move(p->socket), *cred, slots, bytes);
  if (!session.ok()) {
    ReleaseSessionSlot(cred->uid);
    // Create failed before taking the socket only if it could not start; the fd is still ours.
    if (p->socket.valid()) {
      RejectHandshake(fd, hello.request_id, GL_E_NO_MEMORY, Refusal::kNoMemory,
                      absl::StrCat("cannot create the session: ", session.status().message()));
    }
    return;
  }
  // The daemon's alias of the arena, registered with the RDMA device here rather than on the
  // engine thread when a job starts (daemon/arena_alias.h). A device that refuses it (the
  // pinned-memory limit, typically) refuses the session: a job on it could not run.
  auto alias = ArenaAlias::Create((*session)->arena_base(), (*session)->arena_bytes(),
                                  registrar_.load(std::memory_order_acquire));
  if (!alias.ok()) {
    ReleaseSessionSlot(cred->uid);
    RejectHandshake(fd, hello.request_id, GL_E_NO_MEMORY, Refusal::kNoMemory,
                    std::string(alias.status().message()));
    return;  // the session (and the socket it holds) closes here
  }
  (*session)->set_alias(std::move(*alias));
  (*session)->SetAbiVersion(hello.abi_version);
  auto live = std::make_unique<Live>();
  live->session = std::move(*session);
  if (absl::Status s = live->session->SendHelloReply(hello.request_id); !s.ok()) {
    ReleaseSessionSlot(cred->uid);
    return;
  }
  live->pidfd.Reset(PidfdOpen(cred->pid));
  live_sessions_.fetch_add(1, std::memory_order_relaxed);
  sessions_accepted_.fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock lock(&handoff_mu_);
    handoff_.push_back(std::move(live));
  }
  const uint64_t one = 1;
  (void)!::write(handoff_fd_.get(), &one, sizeof(one));
}

void SessionServer::HandleSessionSocket_st(uint64_t session_id, uint32_t events) {
  Session* s = FindSession_st(session_id);
  if (s == nullptr) return;
  // Drain every message first: a client may send a request and close right away.
  for (int i = 0; i < 64; ++i) {
    std::array<shm::UniqueFd, shm::kMaxPassedFds> stray;  // fds from a client are never kept
    // Zeroed so that a refused message shorter than a header reads as request id 0.
    std::memset(rx_buf_.data(), 0, sizeof(gl_msg_header));
    auto rx = shm::ReceiveMessage(s->socket_fd(), rx_buf_.data(), rx_buf_.size(), stray);
    if (!rx.ok()) {
      if (absl::IsUnavailable(rx.status())) break;
      if (absl::IsOutOfRange(rx.status())) {
        // Too long for the buffer, or too many fds: the message is gone, the session goes on,
        // and the client gets its reply like for any other refused request. What was read of
        // it holds the header (a message too long is at least the buffer long).
        gl_msg_header h;
        std::memcpy(&h, rx_buf_.data(), sizeof(h));
        control_messages_refused_.fetch_add(1, std::memory_order_relaxed);
        if (!s->RefuseControl_st(h.request_id, GL_E_PROTOCOL,
                                 absl::StrCat("control message refused: ", rx.status().message(),
                                              " (at most ", GL_MAX_CONTROL_MESSAGE, " bytes and ",
                                              shm::kMaxPassedFds, " file descriptors)"))
                 .ok()) {
          ++totals_.clients_died;
          CloseSession_st(session_id, GL_E_IO, "reply failed");
          return;
        }
        continue;
      }
      ++totals_.clients_died;
      CloseSession_st(session_id, GL_E_IO, std::string(rx.status().message()));
      return;
    }
    if (rx->eof) {
      ++totals_.clients_died;
      CloseSession_st(session_id, GL_E_DISCONNECTED, "client closed the socket");
      return;
    }
    if (!s->HandleControl_st(rx_buf_.data(), rx->bytes, std::span(stray.data(), rx->num_fds),
                             device_memory_.load(std::memory_order_acquire))
             .ok()) {
      ++totals_.clients_died;
      CloseSession_st(session_id, GL_E_IO, "reply failed");
      return;
    }
  }
  if ((events & (EPOLLHUP | EPOLLERR)) != 0) {
    ++totals_.clients_died;
    CloseSession_st(session_id, GL_E_DISCONNECTED, "client socket hung up");
  } else {
    control_pending_ = true;  // stopped at 64 messages, or a hang-up arrives with the data
  }
}

void SessionServer::CloseSession_st(uint64_t session_id, gl_status reason, const std::string& why) {
  auto it = std::find_if(sessions_.begin(), sessions_.end(),
                         [&](const auto& l) { return l->session->id() == session_id; });
  if (it == sessions_.end()) return;
  std::unique_ptr<Live> live = std::move(*it);
  *it = std::move(sessions_.back());
  sessions_.pop_back();
  Session& s = *live->session;
  if (reason != GL_E_DISCONNECTED) s.SendGoodbye_st(reason, why);
  Unwatch(s.socket_fd());
  Unwatch(s.sq_doorbell_fd());
  if (live->pidfd.valid()) Unwatch(live->pidfd.get());
  // Keep the session's counters in the totals; its arena, fds and tensor ids go with it.
  const SessionCounters& c = s.counters_st();
  totals_.posts_ok += c.posts_ok;
  totals_.completions += c.completions;
  for (int k = 0; k < GL_STATUS_COUNT; ++k) {
    totals_.bad_by_status[k] += c.bad_descriptors[k];
    totals_.bad_descriptors += c.bad_descriptors[k];
  }
  ++totals_.sessions_closed;
  live_sessions_.fetch_sub(1, std::memory_order_relaxed);
  ReleaseSessionSlot(s.peer().uid);
  // A job may still hold the alias (its reference is retired when it is released); if not,
  // the acceptor thread deregisters and unmaps it, not this one.
  Retire(s.TakeAlias_st());
  live.reset();
  Publish_st();
}

bool SessionServer::ArmForSleep_st(int* timeout_ms) {
  for (auto& l : sessions_) {
    Session& s = *l->session;
    if (s.completion_stalled_st()) {
      // The client frees completion slots without a doorbell towards us: re-poll soon.
      *timeout_ms = *timeout_ms < 0 || *timeout_ms > 1 ? 1 : *timeout_ms;
      continue;
    }
    if (!s.ArmSubmissionDoorbell_st()) return false;  // a submission is already waiting
  }
  return true;
}

void SessionServer::DisarmAfterSleep_st(bool woke) {
  if (woke) control_pending_ = true;
  for (size_t i = 0; i < sessions_.size(); ++i) {
    sessions_[i]->session->DisarmSubmissionDoorbell_st();
  }
}

void SessionServer::Wait_st(int timeout_ms) {
  bool woke = false;
  if (ArmForSleep_st(&timeout_ms)) {
    epoll_event events[1];
    woke = ::epoll_wait(epoll_.get(), events, 1, timeout_ms) != 0;
  }
  DisarmAfterSleep_st(woke);
}

void SessionServer::Run_st(const std::atomic<bool>& stop, int idle_ms) {
  while (!stop.load(std::memory_order_acquire)) {
    if (PollOnce_st(MonotonicNow()) == 0) Wait_st(idle_ms);
  }
}

void SessionServer::Publish_st() {
  SessionServerStats t = totals_;
  t.sessions_active = sessions_.size();
  for (auto& l : sessions_) {
    const Session& s = *l->session;
    const SessionCounters& c = s.counters_st();
    t.posts_ok += c.posts_ok;
    t.completions += c.completions;
    for (int k = 0; k < GL_STATUS_COUNT; ++k) {
      t.bad_by_status[k] += c.bad_descriptors[k];
      t.bad_descriptors += c.bad_descriptors[k];
    }
    t.arena_bytes_mapped += s.arena_bytes();
    t.tensors_registered += s.tensors_st().size();
  }
  const uint64_t scalars[10] = {t.sessions_accepted, t.sessions_active,     t.sessions_closed,
                                t.clients_died,      t.corrupt_disconnects, t.handshakes_rejected,
                                t.posts_ok,          t.completions,         t.bad_descriptors,
                                t.arena_bytes_mapped};
  for (int i = 0; i < 10; ++i) published_[i].store(scalars[i], std::memory_order_relaxed);
  for (int k = 0; k < GL_STATUS_COUNT; ++k) {
    published_bad_[k].store(t.bad_by_status[k], std::memory_order_relaxed);
  }
  tensors_published_.store(t.tensors_registered, std::memory_order_release);
}

SessionServerStats SessionServer::Stats() const {
  SessionServerStats t;
  t.tensors_registered = tensors_published_.load(std::memory_order_acquire);
  uint64_t* scalars[10] = {&t.sessions_accepted, &t.sessions_active,     &t.sessions_closed,
                           &t.clients_died,      &t.corrupt_disconnects, &t.handshakes_rejected,
                           &t.posts_ok,          &t.completions,         &t.bad_descriptors,
                           &t.arena_bytes_mapped};
  for (int i = 0; i < 10; ++i) *scalars[i] = published_[i].load(std::memory_order_relaxed);
  for (int k = 0; k < GL_STATUS_COUNT; ++k) {
    t.bad_by_status[k] = published_bad_[k].load(std::memory_order_relaxed);
    t.rejected_by_status[k] = rejected_by_status_[k].load(std::memory_order_relaxed);
  }
  for (int k = 0; k < static_cast<int>(Refusal::kCount); ++k) {
    t.refused_by_reason[k] = refused_by_reason_[k].load(std::memory_order_relaxed);
  }
  t.control_messages_refused = control_messages_refused_.load(std::memory_order_relaxed);
  // The acceptor thread's counts are live, not published: a handshake refused while the
  // engine is idle shows up at once.
  t.sessions_accepted = sessions_accepted_.load(std::memory_order_relaxed);
  t.handshakes_rejected = handshakes_rejected_.load(std::memory_order_relaxed);
  return t;
}

}  // namespace gradlane::daemon
