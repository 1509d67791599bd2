#include "transport/tcp/tcp_transport.h"

#include <malloc.h>

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/common/hello.h"

namespace gradlane::transport::tcp {
namespace {

constexpr uint64_t kListenerTag = ~0ull;  // never a PeerHandle: those are 32-bit
constexpr uint32_t kMaxConnections = 4096;
constexpr TimeNs kTimerScanPeriod = sched::kMillisecond;
// Per Progress_st call and connection: bounds the time one busy peer can hold the engine.
constexpr int kMaxReadsPerEvent = 64;
constexpr int kMaxWritesPerFlush = 16;
constexpr size_t kDiscardBytes = 64 * 1024;
// How long a refused connection may take to read our reason before we close regardless.
constexpr TimeNs kMaxLinger = 1 * sched::kSecond;

size_t RxWant(const Connection& c) {
  switch (c.rx_state) {
    case RxState::kHeader:
      return kFrameHeaderBytes - c.rx_got;
    case RxState::kBody:
      return c.rx_header.payload_bytes - c.rx_got;
    case RxState::kPayload:
    case RxState::kDiscard:
      return c.rx_header.length - c.rx_got;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(const TransportOptions& options,
                                                                   TransportHandler* handler) {
  if (handler == nullptr) return absl::InvalidArgumentError("transport needs a handler");
  if (options.max_connections == 0 || options.max_connections > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections must be in [1, ", kMaxConnections, "]"));
  }
  if (options.max_unauthenticated == 0) {
    return absl::InvalidArgumentError("max_unauthenticated must be at least 1");
  }
  if (options.max_pending_sends_per_peer == 0 || options.max_pending_sends_per_peer > (1u << 20)) {
    return absl::InvalidArgumentError("max_pending_sends_per_peer must be in [1, 2^20]");
  }
  if (options.max_segment_bytes == 0 || options.max_segment_bytes > 0xFFFFFFFFull) {
    return absl::InvalidArgumentError(
        "max_segment_bytes must be in [1, 2^32-1] (32-bit on the wire)");
  }
  if (options.peer_timeout <= 0 || options.connect_attempt_timeout <= 0 ||
      options.connect_initial_backoff <= 0 || options.connect_max_backoff <= 0 ||
      options.connect_deadline < 0) {
    return absl::InvalidArgumentError("transport timeouts and back-offs must be positive");
  }
  std::unique_ptr<TcpTransport> t(new TcpTransport(options, handler));
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

TcpTransport::TcpTransport(const TransportOptions& options, TransportHandler* handler)
    : options_(options), handler_(handler), regions_(options.max_regions) {}

absl::Status TcpTransport::Init() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", ErrnoText(errno)));
  if (absl::Status s = conns_.Init(options_.max_connections); !s.ok()) return s;
  dirty_.reserve(options_.max_connections);
  events_.resize(options_.max_connections + 1);
  discard_.resize(kDiscardBytes);
  return absl::OkStatus();
}

TcpTransport::~TcpTransport() {
  conns_.ForEach([](Connection& c) {
    if (c.fd >= 0) close(c.fd);
  });
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

// ---- control ops ------------------------------------------------------------------------------

absl::StatusOr<uint16_t> TcpTransport::Listen_st() {
  if (listen_fd_ >= 0) return absl::FailedPreconditionError("already listening");
  absl::StatusOr<SockAddr> addr = MakeSockAddr(options_.listen_address, options_.listen_port);
  if (!addr.ok()) return addr.status();
  absl::StatusOr<int> fd = OpenListener(*addr, 128);
  if (!fd.ok()) return fd.status();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerTag;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, *fd, &ev) != 0) {
    const int err = errno;
    close(*fd);
    return absl::InternalError(absl::StrCat("epoll_ctl(listener): ", ErrnoText(err)));
  }
  listen_fd_ = *fd;
  listen_port_ = LocalPort(listen_fd_);
  return listen_port_;
}

absl::Status TcpTransport::AddJob_st(const JobCredentials& job) { return jobs_.Add(job); }

absl::Status TcpTransport::RemoveJob_st(uint64_t job_id) {
  return jobs_.Remove(job_id, [&](int j, const absl::Status& why) {
    conns_.ForEach([&](Connection& c) {
      if (c.state != ConnState::kFree && c.state != ConnState::kDead && c.job_index == j)
        Teardown(c, why);
    });
  });
}

absl::StatusOr<PeerHandle> TcpTransport::Connect_st(const JobCredentials& job,
                                                    std::string_view address, TimeNs now) {
  const absl::StatusOr<int> j = jobs_.FindToDial(job.job_id);
  if (!j.ok()) return j.status();
  absl::StatusOr<SockAddr> addr = ParseHostPort(address);
  if (!addr.ok()) return addr.status();
  Connection* c = AllocSlot(/*inbound=*/false);
  if (c == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", conns_.capacity(), " connection slots in use"));
  }
  c->inbound = false;
  c->known = true;
  c->job_index = *j;
  c->addr = *std::move(addr);
  c->give_up_at = now + options_.connect_deadline;
  c->backoff = options_.connect_initial_backoff;
  StartAttempt(*c, now);
  return HandleOf(*c);
}

void TcpTransport::Disconnect_st(PeerHandle peer, TimeNs now) {
  Connection* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == ConnState::kDead || c->state == ConnState::kLingering) return;
  const absl::Status why = absl::CancelledError("disconnected by this daemon");
  if (c->state == ConnState::kEstablished && c->write_off == 0) {
    // Refuse with kShutdown says goodbye in-band, then lingers for the peer's close.
    Refuse(*c, FrameType::kGoodbye, WireError::kShutdown, why, now);
    return;
  }
  Teardown(*c, why);
}

absl::StatusOr<RegionId> TcpTransport::RegisterRegion_st(void* base, uint64_t bytes) {
  return regions_.Register(base, bytes);
}

absl::Status TcpTransport::UnregisterRegion_st(RegionId region) {
  return regions_.Unregister(region);
}

// ---- data path --------------------------------------------------------------------------------

absl::Status TcpTransport::PostSend_st(PeerHandle peer, const SendSpec& spec) {
  Connection* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == ConnState::kDead || c->state == ConnState::kLingering) {
    return absl::NotFoundError("peer handle is not connected");
  }
  if (c->RingFull()) return absl::ResourceExhaustedError("peer send queue full");
  const absl::StatusOr<const uint8_t*> payload =
      regions_.ResolveSend(spec, options_.max_segment_bytes);
  if (!payload.ok()) return payload.status();
  const bool was_idle = !c->HasPending();
  const JobTable::Entry& job = jobs_[c->job_index];
  PendingSend& s = c->Slot(c->post_idx);
  s.header = MakeDataHeader(job.creds.job_id, job.creds.local_rank, spec);
  s.header.seq = static_cast<uint32_t>(c->post_idx);
  s.payload = *payload;
  s.cookie = spec.cookie;
  ++c->post_idx;
  // The progress timer measures silence while work is pending; idle time before this post
  // does not count against the peer.
  if (was_idle) c->restart_progress_timer = true;
  if (c->state == ConnState::kEstablished) MarkDirty(*c);
  return absl::OkStatus();
}

int TcpTransport::Progress_st(TimeNs now, int wait_ms) {
  ReleaseDeadSlots();
  int handled = 0;
  auto flush_dirty = [&] {
    const size_t n = dirty_.size();
    for (size_t i = 0; i < n; ++i) {
      Connection& c = conns_.at(dirty_[i]);
      c.in_dirty_list = false;
      Flush(c, now);
    }
    dirty_.erase(dirty_.begin(), dirty_.begin() + static_cast<ptrdiff_t>(n));
  };
  flush_dirty();
  const int n = epoll_wait(epoll_fd_, events_.data(), static_cast<int>(events_.size()),
                           dirty_.empty() ? wait_ms : 0);
  for (int i = 0; i < n; ++i) {
    const epoll_event& ev = events_[i];
    if (ev.data.u64 == kListenerTag) {
      AcceptAll(now);
      ++handled;
      continue;
    }
    Connection* c = conns_.Lookup(static_cast<PeerHandle>(ev.data.u64));
    if (c == nullptr || c->state == ConnState::kDead) continue;  // torn down earlier this round
    HandleEvent(*c, ev.events, now);
    ++handled;
  }
  CheckTimers(now);
  flush_dirty();  // acks and hellos produced while reading go out in this same step
  ReleaseDeadSlots();
  return handled;
}

void TcpTransport::HandleEvent(Connection& c, uint32_t events, TimeNs now) {
  if (c.state == ConnState::kConnecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
    const int err = ConnectResult(c.fd);
    if (err != 0) {
      AttemptFailed(
          c, absl::UnavailableError(absl::StrCat("connect to ", c.addr.text, ": ", ErrnoText(err))),
          now);
      return;
    }
    OnConnected(c, now);
    return;
  }
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) ReadSome(c, now);
  if ((events & EPOLLOUT) != 0 && c.state != ConnState::kDead) Flush(c, now);
}

void TcpTransport::ReadSome(Connection& c, TimeNs now) {
  for (int calls = 0; calls < kMaxReadsPerEvent; ++calls) {
    if (c.state == ConnState::kDead) return;
    uint8_t* dst;
    size_t want;
    if (c.state == ConnState::kLingering) {
      dst = discard_.data();
      want = discard_.size();
    } else {
      // Every data frame owes an ack; don't start one we could not acknowledge. The peer is
      // back-pressured through TCP until our control bytes drain.
      if (c.rx_state == RxState::kHeader && c.rx_got == 0 && c.CtrlFree() < 2 * kFrameHeaderBytes) {
        MarkDirty(c);
        return;
      }
      want = RxWant(c);
      switch (c.rx_state) {
        case RxState::kHeader:
          dst = reinterpret_cast<uint8_t*>(&c.rx_header) + c.rx_got;
          break;
        case RxState::kBody:
          dst = c.rx_body.data() + c.rx_got;
          break;
        case RxState::kPayload:
          dst = c.rx_dst + c.rx_got;
          break;
        case RxState::kDiscard:
        default:
          dst = discard_.data();
          want = std::min(want, discard_.size());
          break;
      }
    }
    const ssize_t r = recv(c.fd, dst, want, 0);
    if (r > 0) {
      c.last_progress = now;
      if (c.state == ConnState::kLingering) continue;
      c.rx_got += static_cast<size_t>(r);
      if (c.rx_state == RxState::kPayload || c.rx_state == RxState::kDiscard) {
        if (c.rx_got < c.rx_header.length) continue;
        if (!OnPayloadDone(c, now)) return;
      } else if (c.rx_got ==
                 (c.rx_state == RxState::kHeader ? kFrameHeaderBytes : c.rx_header.payload_bytes)) {
        if (!(c.rx_state == RxState::kHeader ? OnHeader(c, now) : OnBody(c, now))) return;
      }
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    const int err = r < 0 ? errno : 0;
    if (c.state == ConnState::kHelloSent) {
      // The listener closed before answering (e.g. it is shutting down): worth another try.
      AttemptFailed(
          c,
          absl::UnavailableError(absl::StrCat("handshake with ", c.addr.text, ": ",
                                              err ? ErrnoText(err) : "connection closed")),
          now);
      return;
    }
    if (c.state == ConnState::kEstablished) counters_.peer_resets.Add_st(1);
    Teardown(c, absl::UnavailableError(absl::StrCat(
                    "peer ", c.inbound ? "(inbound)" : c.addr.text, " rank ", c.peer_rank, " ",
                    err ? absl::StrCat("connection error: ", ErrnoText(err))
                        : "closed the connection")));
    return;
  }
  MarkDirty(c);  // budget spent with input possibly left: epoll is level-triggered, we'll be back
}

bool TcpTransport::OnHeader(Connection& c, TimeNs now) {
  c.rx_got = 0;
  const FrameHeader& h = c.rx_header;
  const WireError e = CheckHeader(h, options_.max_segment_bytes);
  const FrameType reply =
      c.state == ConnState::kAwaitHello ? FrameType::kReject : FrameType::kGoodbye;
  if (e != WireError::kNone) {
    Refuse(c, reply, e, ValidateHeader(h, options_.max_segment_bytes), now);
    return false;
  }
  const FrameType type = TypeOf(h);
  auto unexpected = [&](std::string_view where) {
    Refuse(
        c, reply, WireError::kUnexpectedFrame,
        absl::InvalidArgumentError(absl::StrFormat("unexpected frame type %d %s", h.type, where)),
        now);
    return false;
  };
  switch (c.state) {
    case ConnState::kAwaitHello:
      if (type != FrameType::kHello) return unexpected("before the hello");
      c.rx_state = RxState::kBody;
      return true;
    case ConnState::kHelloSent: {
      if (type == FrameType::kReject) {
        c.rx_state = RxState::kBody;
        return true;
      }
      if (type != FrameType::kHelloOk) return unexpected("during the handshake");
      if (const HandshakeCheck ok = CheckHelloOk(jobs_[c.job_index].creds, h); !ok.ok()) {
        Refuse(c, FrameType::kGoodbye, ok.code, ok.status, now);
        return false;
      }
      c.peer_rank = h.sender_rank;
      c.state = ConnState::kEstablished;
      c.last_progress = now;
      MarkDirty(c);  // sends posted while connecting
      report_.PeerUp(InfoOf(c));
      return c.state == ConnState::kEstablished;
    }
    case ConnState::kEstablished:
      break;
    default:
      return false;
  }
  if (h.job_id != jobs_[c.job_index].creds.job_id) {
    Refuse(c, FrameType::kGoodbye, WireError::kUnknownJob,
           absl::InvalidArgumentError(absl::StrCat("frame for job ", h.job_id,
                                                   " on a connection of job ",
                                                   jobs_[c.job_index].creds.job_id)),
           now);
    return false;
  }
  switch (type) {
    case FrameType::kData: {
      c.rx_target = handler_->ResolveRecv_st(InfoOf(c), h);
      if (c.state != ConnState::kEstablished) return false;
      const std::optional<uint8_t*> dst = regions_.ResolveRecv(c.rx_target, h.length);
      if (dst.has_value()) {
        c.rx_dst = *dst;
      } else {
        c.rx_target.accept = false;
        report_.CountError(WireError::kNoTarget);
      }
      c.rx_state = dst.has_value() ? RxState::kPayload : RxState::kDiscard;
      if (h.length == 0) return OnPayloadDone(c, now);
      return true;
    }
    case FrameType::kAck:
      return OnAck(c, now);
    case FrameType::kGoodbye:
      c.rx_state = RxState::kBody;
      return true;
    default:
      return unexpected("on an established connection");
  }
}

bool TcpTransport::OnBody(Connection& c, TimeNs now) {
  c.rx_got = 0;
  c.rx_state = RxState::kHeader;
  const FrameHeader& h = c.rx_header;
  const FrameType type = TypeOf(h);
  if (type == FrameType::kHello) {
    HelloBody b;
    std::memcpy(&b, c.rx_body.data(), sizeof(b));
    const HandshakeCheck check = CheckHello(jobs_, h, b);
    if (!check.ok()) {
      Refuse(c, FrameType::kReject, check.code, check.status, now);
      return false;
    }
    const JobCredentials& job = jobs_[check.job_index].creds;
    c.job_index = check.job_index;
    c.peer_rank = b.rank;
    // Authenticated: only now is the connection worth a full send ring and ack buffer.
    const uint64_t before = c.StorageBytes();
    c.GrowForData(options_.max_pending_sends_per_peer);
    counters_.connection_buffer_bytes.Add_st(c.StorageBytes() - before);
    const FrameHeader ok = MakeHeader(FrameType::kHelloOk, job.job_id, job.local_rank);
    c.AppendCtrl(ok, nullptr, 0);  // fresh connection: the control buffer is empty
    c.state = ConnState::kEstablished;
    c.known = true;
    c.last_progress = now;
    MarkDirty(c);
    report_.PeerUp(InfoOf(c));
    return c.state == ConnState::kEstablished;
  }
  // kReject or kGoodbye: a code and a reason. A refusal is final (wrong token, job, version,
  // rank): retrying cannot fix it, so it tears down rather than backing off.
  const PeerError error =
      ParseErrorPayload(std::span<const uint8_t>(c.rx_body.data(), h.payload_bytes));
  Teardown(c, PeerClosedStatus(type, error,
                               c.inbound ? absl::StrCat("rank ", c.peer_rank) : c.addr.text));
  return false;
}

bool TcpTransport::OnPayloadDone(Connection& c, TimeNs now) {
  c.rx_got = 0;
  c.rx_state = RxState::kHeader;
  const FrameHeader& h = c.rx_header;
  const JobTable::Entry& job = jobs_[c.job_index];
  const bool accepted = c.rx_target.accept;
  if (accepted) {
    report_.Received(InfoOf(c), c.counters, h, c.rx_target, now);
    if (c.state != ConnState::kEstablished) return false;
  }
  // Acknowledge only after the engine has the bytes: the sender's credit returns on this.
  const FrameHeader ack = MakeAckHeader(h, job.creds.local_rank, !accepted);
  if (!c.AppendCtrl(ack, nullptr, 0)) {
    // Cannot happen: ReadSome reserves room for one ack before each frame.
    Teardown(c, absl::InternalError("ack buffer overflow"));
    return false;
  }
  report_.AckSent(c.counters);
  MarkDirty(c);
  return true;
}

bool TcpTransport::OnAck(Connection& c, TimeNs now) {
  const FrameHeader& h = c.rx_header;
  if (c.ack_idx == c.write_idx) {
    Refuse(c, FrameType::kGoodbye, WireError::kUnexpectedFrame,
           absl::InvalidArgumentError("ack for a segment not sent"), now);
    return false;
  }
  const PendingSend& s = c.Slot(c.ack_idx);
  if (h.seq != s.header.seq || h.key != s.header.key || h.iteration != s.header.iteration ||
      h.offset != s.header.offset || h.length != s.header.length) {
    Refuse(c, FrameType::kGoodbye, WireError::kUnexpectedFrame,
           absl::InvalidArgumentError(
               absl::StrFormat("ack out of order: got seq %d key %d, expected seq %d key %d", h.seq,
                               h.key, s.header.seq, s.header.key)),
           now);
    return false;
  }
  ++c.ack_idx;
  report_.SendAcked(HandleOf(c), c.peer_rank, c.counters, s, (h.flags & kFlagAckRejected) != 0,
                    now);
  return c.state == ConnState::kEstablished;
}

void TcpTransport::Flush(Connection& c, TimeNs now) {
  const ConnState st = c.state;
  if (st != ConnState::kEstablished && st != ConnState::kHelloSent && st != ConnState::kLingering &&
      st != ConnState::kAwaitHello) {
    return;
  }
  const bool with_data = st == ConnState::kEstablished;
  iovec iov[Connection::kMaxIov];
  for (int i = 0; i < kMaxWritesPerFlush; ++i) {
    const size_t n = c.BuildIov(iov, with_data);
    if (n == 0) break;
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t w = sendmsg(c.fd, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        UpdateEpollOut(c, true);
        return;
      }
      const int err = errno;
      if (c.state == ConnState::kHelloSent) {
        AttemptFailed(c,
                      absl::UnavailableError(
                          absl::StrCat("handshake with ", c.addr.text, ": ", ErrnoText(err))),
                      now);
        return;
      }
      if (c.state == ConnState::kEstablished) counters_.peer_resets.Add_st(1);
      Teardown(c, absl::UnavailableError(
                      absl::StrCat("send to peer rank ", c.peer_rank, ": ", ErrnoText(err))));
      return;
    }
    c.last_progress = now;
    const uint64_t before = c.write_idx;
    c.Consume(static_cast<size_t>(w));
    for (uint64_t idx = before; idx != c.write_idx; ++idx) {
      report_.SendLeft(HandleOf(c), c.counters, c.Slot(idx));
      if (c.state != ConnState::kEstablished) return;
    }
  }
  if (c.HasUnwritten() && (with_data || c.ctrl_off != c.ctrl_len)) {
    MarkDirty(c);  // write budget spent; continue next step
    return;
  }
  UpdateEpollOut(c, false);
  if (c.state == ConnState::kLingering) shutdown(c.fd, SHUT_WR);  // reason sent: FIN follows it
}

void TcpTransport::MarkDirty(Connection& c) {
  if (c.in_dirty_list) return;
  c.in_dirty_list = true;
  dirty_.push_back(conns_.IndexOf(c));
}

void TcpTransport::UpdateEpollOut(Connection& c, bool want) {
  if (c.epollout_armed == want || c.fd < 0) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  ev.data.u64 = HandleOf(c);
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) == 0) c.epollout_armed = want;
}

// ---- connection lifecycle ---------------------------------------------------------------------

void TcpTransport::AcceptAll(TimeNs now) {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN, or out of descriptors: the backlog holds them for the next round
    }
    // At the cap, the oldest tokenless connection makes room: whoever floods the port must
    // outpace a real dialer's hello (one round trip) to keep it out, not merely hold slots.
    EvictOldestUnauthenticatedIfFull();
    Connection* c = AllocSlot(/*inbound=*/true);
    if (c == nullptr) {
      counters_.accepts_refused.Add_st(1);
      close(fd);
      continue;
    }
    TunePeerSocket(fd, options_);
    c->fd = fd;
    c->inbound = true;
    c->state = ConnState::kAwaitHello;
    // A dialer that connects and says nothing must not hold a slot for ever.
    c->attempt_deadline = now + options_.peer_timeout;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = HandleOf(*c);
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Teardown(*c, absl::InternalError("epoll_ctl(accepted)"));
    }
  }
}

void TcpTransport::StartAttempt(Connection& c, TimeNs now) {
  counters_.connect_attempts.Add_st(1);
  c.ctrl_off = c.ctrl_len = 0;
  c.rx_state = RxState::kHeader;
  c.rx_got = 0;
  absl::StatusOr<int> fd = StartConnect(c.addr);
  if (!fd.ok()) {
    AttemptFailed(c, fd.status(), now);
    return;
  }
  c.fd = *fd;
  c.state = ConnState::kConnecting;
  c.attempt_deadline = now + options_.connect_attempt_timeout;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
  ev.data.u64 = HandleOf(c);
  c.epollout_armed = true;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
    AttemptFailed(c, absl::InternalError(absl::StrCat("epoll_ctl: ", ErrnoText(errno))), now);
  }
}

void TcpTransport::AttemptFailed(Connection& c, const absl::Status& why, TimeNs now) {
  CloseFd(c);
  c.last_error = why;
  c.state = ConnState::kBackoff;
  // Never give up synchronously (Connect_st must return the handle before any callback):
  // CheckTimers reports the peer down once give_up_at has passed.
  c.retry_at = std::min(now + c.backoff, c.give_up_at);
  c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
}

void TcpTransport::OnConnected(Connection& c, TimeNs now) {
  TunePeerSocket(c.fd, options_);
  const HelloFrame hello = MakeHello(jobs_[c.job_index].creds);
  c.AppendCtrl(hello.header, &hello.body, sizeof(hello.body));
  c.state = ConnState::kHelloSent;
  c.last_progress = now;
  UpdateEpollOut(c, false);
  MarkDirty(c);
}

void TcpTransport::CheckTimers(TimeNs now) {
  // Every deadline here is milliseconds to seconds away: scanning the slots on every step
  // (hundreds of thousands of steps a second under load) would only burn the engine's core.
  if (now - last_timer_scan_ < kTimerScanPeriod) return;
  last_timer_scan_ = now;
  conns_.ForEach([&](Connection& c) {
    switch (c.state) {
      case ConnState::kBackoff:
        if (now < c.retry_at) break;
        if (now >= c.give_up_at) {
          Teardown(c, absl::DeadlineExceededError(
                          absl::StrCat("could not connect to ", c.addr.text, " within ",
                                       options_.connect_deadline / sched::kMillisecond,
                                       " ms: ", c.last_error.message())));
        } else {
          counters_.connect_retries.Add_st(1);
          StartAttempt(c, now);
        }
        break;
      case ConnState::kConnecting:
      case ConnState::kHelloSent:
        if (now >= c.attempt_deadline) {
          AttemptFailed(c,
                        absl::DeadlineExceededError(
                            absl::StrCat("attempt to reach ", c.addr.text, " timed out")),
                        now);
        }
        break;
      case ConnState::kAwaitHello:
        if (now >= c.attempt_deadline) {
          report_.CountError(WireError::kTimeout);
          Teardown(c, absl::DeadlineExceededError("no hello"));
        }
        break;
      case ConnState::kLingering:
        if (now >= c.attempt_deadline) Teardown(c, absl::CancelledError("linger over"));
        break;
      case ConnState::kEstablished:
        if (c.restart_progress_timer) {
          c.restart_progress_timer = false;
          c.last_progress = std::max(c.last_progress, now);
        } else if (c.HasPending() && now - c.last_progress > options_.peer_timeout) {
          counters_.peer_timeouts.Add_st(1);
          const uint64_t pending = c.post_idx - c.ack_idx;
          Refuse(c, FrameType::kGoodbye, WireError::kTimeout,
                 absl::DeadlineExceededError(absl::StrFormat(
                     "peer rank %d made no progress for %d ms with %d sends pending", c.peer_rank,
                     options_.peer_timeout / sched::kMillisecond, pending)),
                 now);
        }
        break;
      default:
        break;
    }
  });
}

void TcpTransport::Refuse(Connection& c, FrameType type, WireError code, const absl::Status& why,
                          TimeNs now) {
  if (code != WireError::kShutdown) report_.CountError(code);
  const bool can_say_why = c.write_off == 0;  // never inside a half-written data frame
  // Fail the engine's pending work first (in order), then tell it the peer is down.
  const ConnState was = c.state;
  c.state = ConnState::kLingering;
  c.attempt_deadline = now + std::min(kMaxLinger, options_.peer_timeout);
  FailPendingAndReportDown(c, why);
  if (!can_say_why || c.fd < 0 || was == ConnState::kConnecting) {
    Teardown(c, why);
    return;
  }
  const uint64_t job_id = c.job_index >= 0 ? jobs_[c.job_index].creds.job_id : c.rx_header.job_id;
  const uint16_t rank = c.job_index >= 0 ? jobs_[c.job_index].creds.local_rank : 0;
  const absl::string_view text = why.message();  // not std::string_view in this absl
  const ErrorFrame f =
      MakeErrorFrame(type, job_id, rank, code, std::string_view(text.data(), text.size()));
  c.AppendCtrl(f.header, &f.payload, f.header.payload_bytes);
  MarkDirty(c);
}

void TcpTransport::FailPendingAndReportDown(Connection& c, const absl::Status& why) {
  // The ring in post order: [ack_idx, write_idx) is unacknowledged, [write_idx, post_idx)
  // unwritten.
  report_.FailPendingAndReportDown(
      InfoOf(c), c.known, c.counters,
      [&c]() -> const PendingSend* {
        if (c.ack_idx == c.post_idx) return nullptr;
        const PendingSend* s = &c.Slot(c.ack_idx++);
        c.write_idx = std::max(c.write_idx, c.ack_idx);
        return s;
      },
      why);
}

void TcpTransport::Teardown(Connection& c, const absl::Status& why) {
  if (c.state == ConnState::kDead || c.state == ConnState::kFree) return;
  c.state = ConnState::kDead;
  CloseFd(c);
  FailPendingAndReportDown(c, why);
  conns_.Retire(c);
}

void TcpTransport::CloseFd(Connection& c) {
  if (c.fd < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  c.fd = -1;
  c.epollout_armed = false;
}

void TcpTransport::ReleaseDeadSlots() {
  conns_.ReleaseRetired([&](Connection& c) {
    c.state = ConnState::kFree;
    // An idle slot keeps no buffers: a flood of connections must not pin memory after it ends.
    const uint64_t held = c.StorageBytes();
    counters_.connection_buffer_bytes.Sub_st(held);
    released_since_trim_ += held;
    c.ReleaseStorage();
  });
  // The allocator keeps freed buffers for reuse; after a flood, hand the pages back to the
  // kernel (control path, at most once per kTrimAfterBytes released).
  if (released_since_trim_ >= kTrimAfterBytes) {
    released_since_trim_ = 0;
    ::malloc_trim(0);
  }
}

Connection* TcpTransport::AllocSlot(bool inbound) {
  Connection* slot = conns_.Alloc();
  if (slot == nullptr) return nullptr;
  Connection& c = *slot;
  // Our own dials get their full storage at once (sends may be posted while connecting); an
  // inbound connection grows it when its hello proves it belongs to a job.
  if (inbound) {
    c.InitHandshake();
  } else {
    c.Init(options_.max_pending_sends_per_peer);
  }
  counters_.connection_buffer_bytes.Add_st(c.StorageBytes());
  c.ResetForUse();
  return &c;
}

void TcpTransport::EvictOldestUnauthenticatedIfFull() {
  uint32_t n = 0;
  Connection* oldest = nullptr;
  conns_.ForEach([&](Connection& c) {
    if (c.state != ConnState::kAwaitHello) return;
    ++n;
    if (oldest == nullptr || c.attempt_deadline < oldest->attempt_deadline) oldest = &c;
  });
  if (n < options_.max_unauthenticated || oldest == nullptr) return;
  counters_.unauthenticated_evicted.Add_st(1);
  Teardown(*oldest, absl::UnavailableError("evicted: no hello, and newer connections waiting"));
}

PeerInfo TcpTransport::InfoOf(const Connection& c) const {
  return jobs_.PeerInfoOf(HandleOf(c), c.job_index, c.peer_rank, c.inbound);
}

// ---- stats ------------------------------------------------------------------------------------

TransportStats TcpTransport::Stats() const { return counters_.Snapshot(); }

PeerStats TcpTransport::PeerStatsOf(PeerHandle peer) const {
  // Any thread: only atomics are read (the generation check, then the counters). A slot
  // recycled between the two reads yields the new connection's (reset) counters.
  const Connection* c = conns_.LookupAnyThread(peer);
  return c != nullptr ? c->counters.Snapshot() : PeerStats{};
}

}  // namespace gradlane::transport::tcp
