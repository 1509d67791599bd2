#include "tests/fakes/fake_transport.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/common/hello.h"

namespace gradlane::transport::fake {
// ---- network ----------------------------------------------------------------------------------

FakeTransport* FakeNetwork::Find(std::string_view address) const {
  const auto it = endpoints_.find(std::string(address));
  return it == endpoints_.end() ? nullptr : it->second;
}

void FakeNetwork::Kill(std::string_view address, bool silent) {
  FakeTransport* t = Find(address);
  if (t == nullptr || t->silenced_) return;
  if (!silent) {
    // A dead process's kernel resets its connections: each peer hears of it.
    t->conns_.ForEach([&](FakeTransport::Conn& c) {
      if (c.state == FakeTransport::State::kDown || c.remote_conn == kNoPeer) return;
      FakeTransport::Message m;
      m.type = FrameType::kGoodbye;
      m.to_conn = c.remote_conn;
      m.code = WireError::kShutdown;
      m.reason = "connection reset by peer";
      t->Deliver(c.remote_address, std::move(m));
    });
  }
  t->silenced_ = true;
}

// ---- lifecycle --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<FakeTransport>> FakeTransport::Create(
    const TransportOptions& options, TransportHandler* handler, FakeNetwork* network) {
  if (handler == nullptr || network == nullptr) {
    return absl::InvalidArgumentError("fake transport needs a handler and a network");
  }
  std::unique_ptr<FakeTransport> t(new FakeTransport(options, handler, network));
  if (absl::Status s = t->conns_.Init(options.max_connections); !s.ok()) return s;
  return t;
}

FakeTransport::FakeTransport(const TransportOptions& options, TransportHandler* handler,
                             FakeNetwork* network)
    : options_(options), handler_(handler), network_(network), regions_(options.max_regions) {
  // Every endpoint has an identity (dialers too) so replies can find their way back.
  address_ = absl::StrCat("fake-endpoint-", network_->next_identity_++);
  network_->endpoints_[address_] = this;
}

FakeTransport::~FakeTransport() {
  for (auto& [region, map] : device_maps_) ::munmap(map.host, map.bytes);
  network_->Kill(address_, /*silent=*/false);
  for (auto it = network_->endpoints_.begin(); it != network_->endpoints_.end();) {
    if (it->second == this) {
      network_->endpoints_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<uint16_t> FakeTransport::Listen_st() {
  const uint16_t port = options_.listen_port != 0 ? options_.listen_port : network_->next_port_++;
  const std::string addr = absl::StrCat(options_.listen_address, ":", port);
  if (network_->Find(addr) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", addr, ": address already in use"));
  }
  network_->endpoints_[addr] = this;
  return port;
}

absl::Status FakeTransport::AddJob_st(const JobCredentials& job) { return jobs_.Add(job); }

absl::Status FakeTransport::RemoveJob_st(uint64_t job_id) {
  // Connections keep their index into jobs_ until their slots are freed.
  return jobs_.Remove(job_id, [&](int j, const absl::Status& why) {
    conns_.ForEach([&](Conn& c) {
      if (c.job == j && c.state != State::kDown) Down(c, why, /*tell_peer=*/true, now_);
    });
  });
}

absl::StatusOr<PeerHandle> FakeTransport::Connect_st(const JobCredentials& job,
                                                     std::string_view address, TimeNs now) {
  now_ = std::max(now_, now);
  const absl::StatusOr<int> j = jobs_.FindToDial(job.job_id);
  if (!j.ok()) return j.status();
  Conn* c = AllocConn();
  if (c == nullptr) return absl::ResourceExhaustedError("no free connection slot");
  c->known = true;
  c->job = *j;
  c->remote_address = std::string(address);
  c->give_up_at = now + options_.connect_deadline;
  c->backoff = options_.connect_initial_backoff;
  c->retry_at = now;
  return conns_.HandleOf(*c);
}

void FakeTransport::Disconnect_st(PeerHandle peer, TimeNs now) {
  Conn* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == State::kDown) return;
  Down(*c, absl::CancelledError("disconnected by this daemon"), /*tell_peer=*/true, now);
}

absl::StatusOr<RegionId> FakeTransport::RegisterRegion_st(void* base, uint64_t bytes) {
  return regions_.Register(base, bytes);
}

absl::Status FakeTransport::UnregisterRegion_st(RegionId region) {
  if (absl::Status s = regions_.Unregister(region); !s.ok()) return s;
  if (auto it = device_maps_.find(region); it != device_maps_.end()) {
    ::munmap(it->second.host, it->second.bytes);
    device_maps_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<RegionId> FakeTransport::RegisterDeviceRegion_st(int dmabuf_fd, uint64_t bytes,
                                                                uint64_t iova) {
  if (bytes == 0 || iova == 0) return absl::InvalidArgumentError("an empty or unplaced dma-buf");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, dmabuf_fd, 0);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("mapping the dma-buf (fd ", dmabuf_fd, "): ", std::strerror(errno)));
  }
  // As the verbs backend does, the table holds the NIC's address (the iova, the client's device
  // address: dereferencing it faults), and only this "NIC" translates it to the mapping.
  absl::StatusOr<RegionId> id = regions_.Register(reinterpret_cast<void*>(iova), bytes);
  if (!id.ok()) {
    ::munmap(p, bytes);
    return id;
  }
  device_maps_[*id] = DeviceMap{static_cast<uint8_t*>(p), bytes, iova};
  return id;
}

uint8_t* FakeTransport::NicAddress(RegionId region, const uint8_t* at) const {
  auto it = device_maps_.find(region);
  if (it == device_maps_.end()) return const_cast<uint8_t*>(at);
  return it->second.host + (reinterpret_cast<uint64_t>(at) - it->second.iova);
}

// ---- data path --------------------------------------------------------------------------------

absl::Status FakeTransport::PostSend_st(PeerHandle peer, const SendSpec& spec) {
  Conn* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == State::kDown)
    return absl::NotFoundError("peer handle is not connected");
  if (c->pending.size() >= options_.max_pending_sends_per_peer) {
    return absl::ResourceExhaustedError("peer send queue full");
  }
  const absl::StatusOr<const uint8_t*> payload =
      regions_.ResolveSend(spec, options_.max_segment_bytes);
  if (!payload.ok()) return payload.status();
  const JobCredentials& job = jobs_[c->job].creds;
  PendingSend p;
  p.header = MakeDataHeader(job.job_id, job.local_rank, spec);
  p.header.seq = c->next_seq++;
  p.payload = NicAddress(spec.region, *payload);
  p.cookie = spec.cookie;
  if (c->pending.empty()) c->restart_timer = true;
  c->pending.push_back(p);
  return absl::OkStatus();
}

int FakeTransport::Progress_st(TimeNs now, int /*wait_ms*/) {
  now_ = std::max(now_, now);
  // No handle of an earlier step is in flight here: slots retired since then can be reused.
  conns_.ReleaseRetired([](Conn& c) { c.pending.clear(); });
  if (silenced_) return 0;  // a vanished endpoint does nothing
  int handled = 0;
  // Connect attempts, retries and the give-up deadline.
  conns_.ForEach([&](Conn& c) {
    if (c.state == State::kHelloSent && now >= c.retry_at) {
      c.state = State::kBackoff;  // attempt timed out (hello or reply lost)
      c.retry_at = std::min(now + c.backoff, c.give_up_at);
      c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
    }
    if (c.state != State::kBackoff || now < c.retry_at) return;
    if (now >= c.give_up_at) {
      Down(c,
           absl::DeadlineExceededError(
               absl::StrCat("could not connect to ", c.remote_address, " within ",
                            options_.connect_deadline / sched::kMillisecond, " ms")),
           false, now);
      return;
    }
    TryHello(c, now);
  });
  Flush(now);
  while (!inbox_.empty() && inbox_.front().deliver_at <= now) {
    Message m = std::move(inbox_.front());
    inbox_.pop_front();
    Handle(m, now);
    ++handled;
  }
  conns_.ForEach([&](Conn& c) {
    if (c.state != State::kEstablished) return;
    if (c.restart_timer) {
      c.restart_timer = false;
      c.last_progress = now;
    } else if (c.sent > 0 && now - c.last_progress > options_.peer_timeout) {
      counters_.peer_timeouts.Add_st(1);
      report_.CountError(WireError::kTimeout);
      Down(c,
           absl::DeadlineExceededError(absl::StrFormat(
               "peer rank %d made no progress for %d ms with %d sends pending", c.peer_rank,
               options_.peer_timeout / sched::kMillisecond, c.pending.size())),
           true, now, WireError::kTimeout);
    }
  });
  Flush(now);  // sends posted from callbacks leave in the same step
  return handled;
}

void FakeTransport::Flush(TimeNs now) {
  conns_.ForEach([&](Conn& c) {
    while (c.state == State::kEstablished && c.sent < c.pending.size()) {
      // A copy: the handler may disconnect (and so empty the queue) from OnSendDone_st.
      const PendingSend p = c.pending[c.sent++];
      Message m;
      m.type = FrameType::kData;
      m.to_conn = c.remote_conn;
      m.from_conn = conns_.HandleOf(c);
      m.header = p.header;
      m.payload.assign(p.payload, p.payload + p.header.length);
      m.deliver_at = now + network_->delay_;
      Deliver(c.remote_address, std::move(m));
      c.last_progress = now;
      report_.SendLeft(conns_.HandleOf(c), c.counters, p);
    }
  });
}

void FakeTransport::TryHello(Conn& c, TimeNs now) {
  counters_.connect_attempts.Add_st(1);
  if (c.attempts++ > 0) counters_.connect_retries.Add_st(1);
  FakeTransport* remote = network_->Find(c.remote_address);
  if (remote == nullptr || remote->silenced_) {
    // Nobody listening (connection refused): back off and retry.
    c.retry_at = std::min(now + c.backoff, c.give_up_at);
    c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
    return;
  }
  const HelloFrame hello = MakeHello(jobs_[c.job].creds);
  Message m;
  m.type = FrameType::kHello;
  m.from_conn = conns_.HandleOf(c);
  m.from_address = address_;
  m.header = hello.header;
  m.hello = hello.body;
  m.deliver_at = now + network_->delay_;
  c.state = State::kHelloSent;
  c.retry_at = now + options_.connect_attempt_timeout;
  Deliver(c.remote_address, std::move(m));
}

void FakeTransport::Deliver(const std::string& to, Message m) {
  FakeTransport* r = network_->Find(to);
  if (r == nullptr || r->silenced_ || silenced_) return;  // dropped on the floor
  if (network_->tamper_ && m.type == FrameType::kData) network_->tamper_(m.header);
  r->inbox_.push_back(std::move(m));
}

void FakeTransport::Reply(const Message& to, FrameType type, WireError code,
                          const std::string& reason, const Conn* from, TimeNs now) {
  Message m;
  m.type = type;
  m.to_conn = to.from_conn;
  m.from_conn = from != nullptr ? conns_.HandleOf(*from) : kNoPeer;
  m.code = code;
  m.reason = reason;
  m.deliver_at = now + network_->delay_;
  if (from != nullptr) {
    const JobCredentials& job = jobs_[from->job].creds;
    m.header = MakeHeader(type, job.job_id, job.local_rank);
  }
  Deliver(to.from_address, std::move(m));
}

void FakeTransport::HandleHello(Message& m, TimeNs now) {
  const HandshakeCheck check = CheckHello(jobs_, m.header, m.hello);
  if (!check.ok()) {
    report_.CountError(check.code);
    Reply(m, FrameType::kReject, check.code, std::string(check.status.message()), nullptr, now);
    return;
  }
  Conn* c = AllocConn();
  if (c == nullptr) {
    // As a full TCP backend closes the socket: the dialer's attempt fails and it retries.
    counters_.accepts_refused.Add_st(1);
    return;
  }
  c->state = State::kEstablished;
  c->inbound = true;
  c->known = true;
  c->job = check.job_index;
  c->peer_rank = m.hello.rank;
  c->remote_address = m.from_address;
  c->remote_conn = m.from_conn;
  c->last_progress = now;
  Reply(m, FrameType::kHelloOk, WireError::kNone, "", c, now);
  report_.PeerUp(InfoOf(*c));
}

void FakeTransport::Handle(Message& m, TimeNs now) {
  if (m.type == FrameType::kHello) {
    HandleHello(m, now);
    return;
  }
  Conn* c = conns_.Lookup(m.to_conn);
  if (c == nullptr || c->state == State::kDown) return;  // stale: the connection is gone
  c->last_progress = now;
  switch (m.type) {
    case FrameType::kHelloOk: {
      if (c->state != State::kHelloSent) return;
      c->remote_conn = m.from_conn;
      if (const HandshakeCheck ok = CheckHelloOk(jobs_[c->job].creds, m.header); !ok.ok()) {
        report_.CountError(ok.code);
        Down(*c, ok.status, /*tell_peer=*/true, now, ok.code);
        return;
      }
      c->state = State::kEstablished;
      c->peer_rank = m.header.sender_rank;
      report_.PeerUp(InfoOf(*c));
      return;
    }
    case FrameType::kReject:
      if (c->state != State::kHelloSent) return;
      Down(*c, PeerClosedStatus(FrameType::kReject, PeerError{m.code, m.reason}, c->remote_address),
           false, now);
      return;
    case FrameType::kGoodbye:
      counters_.peer_resets.Add_st(1);
      Down(*c,
           PeerClosedStatus(FrameType::kGoodbye, PeerError{m.code, m.reason},
                            absl::StrCat("rank ", c->peer_rank)),
           false, now);
      return;
    case FrameType::kData:
      HandleData(*c, m, now);
      return;
    case FrameType::kAck:
      HandleAck(*c, m, now);
      return;
    default:
      return;
  }
}

void FakeTransport::HandleData(Conn& c, Message& m, TimeNs now) {
  const RecvTarget t = handler_->ResolveRecv_st(InfoOf(c), m.header);
  if (c.state == State::kDown) return;  // the handler disconnected it (as TCP and DPDK do)
  std::optional<uint8_t*> dst = regions_.ResolveRecv(t, m.header.length);
  if (dst.has_value() && device_maps_.contains(t.region)) {
    // GPU memory: only a rendezvous write may land there (verbs cannot place an eager payload
    // with the CPU), so a segment without kFlagRendezvous is refused, whatever its size.
    if ((m.header.flags & kFlagRendezvous) == 0 || t.by_piece) {
      dst.reset();
      ++device_eager_refused_;
    } else {
      dst = NicAddress(t.region, *dst);
    }
  }
  if (dst.has_value()) {
    if (t.by_piece) {
      const uint64_t piece = network_->piece_bytes_ == 0 ? m.header.length : network_->piece_bytes_;
      for (uint64_t off = 0; off < m.header.length; off += piece) {
        handler_->OnRecvPiece_st(
            InfoOf(c), m.header, t, off,
            std::span<const uint8_t>(m.payload.data() + off,
                                     std::min<uint64_t>(piece, m.header.length - off)));
      }
    } else if (m.header.length > 0) {
      std::memcpy(*dst, m.payload.data(), m.header.length);
    }
    report_.Received(InfoOf(c), c.counters, m.header, t, now);
  } else {
    report_.CountError(WireError::kNoTarget);
  }
  Message ack;
  ack.type = FrameType::kAck;
  ack.to_conn = c.remote_conn;
  ack.from_conn = conns_.HandleOf(c);
  ack.header = MakeAckHeader(m.header, jobs_[c.job].creds.local_rank, !dst.has_value());
  ack.deliver_at = now + network_->delay_;
  report_.AckSent(c.counters);
  Deliver(c.remote_address, std::move(ack));
}

void FakeTransport::HandleAck(Conn& c, const Message& m, TimeNs now) {
  if (c.sent == 0 || c.pending.front().header.seq != m.header.seq) return;
  const PendingSend p = c.pending.front();
  c.pending.pop_front();
  --c.sent;
  report_.SendAcked(conns_.HandleOf(c), c.peer_rank, c.counters, p,
                    (m.header.flags & kFlagAckRejected) != 0, now);
}

void FakeTransport::Down(Conn& c, const absl::Status& why, bool tell_peer, TimeNs now,
                         WireError code) {
  if (c.state == State::kDown) return;
  c.state = State::kDown;
  // remote_conn is set once the peer answered: only then is there anyone to say goodbye to.
  if (tell_peer && c.remote_conn != kNoPeer) {
    Message m;
    m.type = FrameType::kGoodbye;
    m.to_conn = c.remote_conn;
    m.code = code;
    m.reason = std::string(why.message());
    m.deliver_at = now + network_->delay_;
    Deliver(c.remote_address, std::move(m));
  }
  PendingSend failing;
  report_.FailPendingAndReportDown(
      InfoOf(c), c.known, c.counters,
      [&]() -> const PendingSend* {
        if (c.pending.empty()) return nullptr;
        failing = c.pending.front();  // unacknowledged ones first: they are older than the unsent
        c.pending.pop_front();
        if (c.sent > 0) --c.sent;
        return &failing;
      },
      why);
  conns_.Retire(c);
}

FakeTransport::Conn* FakeTransport::AllocConn() {
  Conn* c = conns_.Alloc();
  if (c != nullptr) c->Reset();
  return c;
}

void FakeTransport::Conn::Reset() {
  state = State::kBackoff;
  inbound = known = false;
  job = -1;
  peer_rank = 0;
  remote_address.clear();
  remote_conn = kNoPeer;
  next_seq = 0;
  attempts = 0;
  pending.clear();
  sent = 0;
  give_up_at = retry_at = backoff = last_progress = 0;
  restart_timer = false;
  counters.Reset_st();
}

PeerInfo FakeTransport::InfoOf(const Conn& c) const {
  return jobs_.PeerInfoOf(conns_.HandleOf(c), c.job, c.peer_rank, c.inbound);
}

PeerStats FakeTransport::PeerStatsOf(PeerHandle peer) const {
  const Conn* c = conns_.LookupAnyThread(peer);
  return c != nullptr ? c->counters.Snapshot() : PeerStats{};
}

}  // namespace gradlane::transport::fake
