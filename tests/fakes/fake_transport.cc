#include "tests/fakes/fake_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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
    for (size_t i = 0; i < t->conns_.size(); ++i) {
      FakeTransport::Conn& c = *t->conns_[i];
      if (c.state == FakeTransport::State::kDown || c.remote_conn == kNoPeer) continue;
      FakeTransport::Message m;
      m.type = FrameType::kGoodbye;
      m.to_conn = c.remote_conn;
      m.code = WireError::kShutdown;
      m.reason = "connection reset by peer";
      t->Deliver(c.remote_address, std::move(m));
    }
  }
  t->silenced_ = true;
}

// ---- lifecycle --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<FakeTransport>> FakeTransport::Create(const TransportOptions& options,
                                                                      TransportHandler* handler,
                                                                      FakeNetwork* network) {
  if (handler == nullptr || network == nullptr) {
    return absl::InvalidArgumentError("fake transport needs a handler and a network");
  }
  return std::unique_ptr<FakeTransport>(new FakeTransport(options, handler, network));
}

FakeTransport::FakeTransport(const TransportOptions& options, TransportHandler* handler,
                             FakeNetwork* network)
    : options_(options), handler_(handler), network_(network) {
  // Every endpoint has an identity (dialers too) so replies can find their way back.
  address_ = absl::StrCat("fake-endpoint-", network_->next_identity_++);
  network_->endpoints_[address_] = this;
}

FakeTransport::~FakeTransport() {
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
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", addr, ": address already in use"));
  }
  network_->endpoints_[addr] = this;
  return port;
}

absl::Status FakeTransport::AddJob_st(const JobCredentials& job) {
  if (job.token.size() > kMaxTokenBytes) return absl::InvalidArgumentError("auth token too long");
  if (job.world_size == 0 || job.local_rank >= job.world_size) {
    return absl::InvalidArgumentError("rank out of range for world size");
  }
  if (FindJob(job.job_id) >= 0) return absl::AlreadyExistsError("job already added");
  jobs_.push_back(job);
  job_removed_.push_back(false);
  return absl::OkStatus();
}

absl::Status FakeTransport::RemoveJob_st(uint64_t job_id) {
  const int j = FindJob(job_id);
  if (j < 0) return absl::NotFoundError(absl::StrCat("job ", job_id, " not added"));
  for (size_t h = 0; h < conns_.size(); ++h) {
    if (conns_[h]->job == j && conns_[h]->state != State::kDown) {
      Down(static_cast<PeerHandle>(h), absl::CancelledError(absl::StrCat("job ", job_id, " removed")),
           /*tell_peer=*/true, now_);
    }
  }
  // Connections keep their index into jobs_, so the entry stays, hidden from hellos and dials.
  job_removed_[j] = true;
  return absl::OkStatus();
}

int FakeTransport::FindJob(uint64_t job_id) const {
  for (size_t i = 0; i < jobs_.size(); ++i) {
    if (jobs_[i].job_id == job_id && !job_removed_[i]) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<PeerHandle> FakeTransport::Connect_st(const JobCredentials& job,
                                                     std::string_view address, TimeNs now) {
  now_ = std::max(now_, now);
  const int j = FindJob(job.job_id);
  if (j < 0) return absl::FailedPreconditionError("job must be added before connecting");
  auto c = std::make_unique<Conn>();
  c->known = true;
  c->job = j;
  c->remote_address = std::string(address);
  c->give_up_at = now + options_.connect_deadline;
  c->backoff = options_.connect_initial_backoff;
  c->retry_at = now;
  conns_.push_back(std::move(c));
  return static_cast<PeerHandle>(conns_.size() - 1);
}

void FakeTransport::Disconnect_st(PeerHandle peer, TimeNs now) {
  Conn* c = Lookup(peer);
  if (c == nullptr || c->state == State::kDown) return;
  Down(peer, absl::CancelledError("disconnected by this daemon"), /*tell_peer=*/true, now);
}

absl::StatusOr<RegionId> FakeTransport::RegisterRegion_st(void* base, uint64_t bytes) {
  if (base == nullptr && bytes > 0) return absl::InvalidArgumentError("region base is null");
  if (regions_.size() >= options_.max_regions) return absl::ResourceExhaustedError("too many regions");
  regions_.push_back(Region{static_cast<uint8_t*>(base), bytes, true});
  return static_cast<RegionId>(regions_.size() - 1);
}

absl::Status FakeTransport::UnregisterRegion_st(RegionId region) {
  if (region >= regions_.size() || !regions_[region].used) return absl::NotFoundError("region not registered");
  regions_[region].used = false;
  return absl::OkStatus();
}

// ---- data path --------------------------------------------------------------------------------

absl::Status FakeTransport::PostSend_st(PeerHandle peer, const SendSpec& spec) {
  Conn* c = Lookup(peer);
  if (c == nullptr || c->state == State::kDown) return absl::NotFoundError("peer handle is not connected");
  if (c->unsent.size() + c->unacked.size() >= options_.max_pending_sends_per_peer) {
    return absl::ResourceExhaustedError("peer send queue full");
  }
  const absl::StatusOr<const uint8_t*> payload =
      ResolveSendPayload(regions_, spec, options_.max_segment_bytes);
  if (!payload.ok()) return payload.status();
  const JobCredentials& job = jobs_[c->job];
  Pending p;
  p.header = MakeDataHeader(job.job_id, job.local_rank, spec);
  p.header.seq = c->next_seq++;
  p.payload = *payload;
  p.cookie = spec.cookie;
  if (c->unsent.empty() && c->unacked.empty()) c->restart_timer = true;
  c->unsent.push_back(p);
  return absl::OkStatus();
}

int FakeTransport::Progress_st(TimeNs now, int /*wait_ms*/) {
  now_ = std::max(now_, now);
  if (silenced_) return 0;  // a vanished endpoint does nothing
  int handled = 0;
  auto flush = [&] {
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn& c = *conns_[i];
      while (c.state == State::kEstablished && !c.unsent.empty()) {
        Pending p = c.unsent.front();
        c.unsent.pop_front();
        c.unacked.push_back(p);
        Message m;
        m.type = FrameType::kData;
        m.to_conn = c.remote_conn;
        m.from_conn = static_cast<PeerHandle>(i);
        m.header = p.header;
        m.payload.assign(p.payload, p.payload + p.header.length);
        m.deliver_at = now + network_->delay_;
        Deliver(c.remote_address, std::move(m));
        c.last_progress = now;
        c.stats.bytes_sent += p.header.length;
        c.stats.frames_sent += 1;
        stats_.total.bytes_sent += p.header.length;
        stats_.total.frames_sent += 1;
        handler_->OnSendDone_st(SendCompletion{static_cast<PeerHandle>(i), p.cookie, p.header.key,
                                               p.header.iteration, p.header.offset, p.header.length});
      }
    }
  };
  // Connect attempts, retries and the give-up deadline.
  for (size_t i = 0; i < conns_.size(); ++i) {
    Conn& c = *conns_[i];
    if (c.state == State::kHelloSent && now >= c.retry_at) {
      c.state = State::kBackoff;  // attempt timed out (hello or reply lost)
      c.retry_at = std::min(now + c.backoff, c.give_up_at);
      c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
    }
    if (c.state != State::kBackoff || now < c.retry_at) continue;
    if (now >= c.give_up_at) {
      Down(static_cast<PeerHandle>(i),
           absl::DeadlineExceededError(absl::StrCat("could not connect to ", c.remote_address, " within ",
                                                    options_.connect_deadline / sched::kMillisecond, " ms")),
           false, now);
      continue;
    }
    TryHello(static_cast<PeerHandle>(i), now);
  }
  flush();
  while (!inbox_.empty() && inbox_.front().deliver_at <= now) {
    Message m = std::move(inbox_.front());
    inbox_.pop_front();
    Handle(m, now);
    ++handled;
  }
  for (size_t i = 0; i < conns_.size(); ++i) {
    Conn& c = *conns_[i];
    if (c.state != State::kEstablished) continue;
    if (c.restart_timer) {
      c.restart_timer = false;
      c.last_progress = now;
    } else if (!c.unacked.empty() && now - c.last_progress > options_.peer_timeout) {
      stats_.peer_timeouts += 1;
      stats_.errors[static_cast<size_t>(WireError::kTimeout)] += 1;
      Down(static_cast<PeerHandle>(i),
           absl::DeadlineExceededError(absl::StrFormat(
               "peer rank %d made no progress for %d ms with %d sends pending", c.peer_rank,
               options_.peer_timeout / sched::kMillisecond, c.unacked.size() + c.unsent.size())),
           true, now);
    }
  }
  flush();  // sends posted from callbacks leave in the same step
  return handled;
}

void FakeTransport::TryHello(PeerHandle h, TimeNs now) {
  Conn& c = *conns_[h];
  stats_.connect_attempts += 1;
  if (c.attempts++ > 0) stats_.connect_retries += 1;
  FakeTransport* remote = network_->Find(c.remote_address);
  if (remote == nullptr || remote->silenced_) {
    // Nobody listening (connection refused): back off and retry.
    c.retry_at = std::min(now + c.backoff, c.give_up_at);
    c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
    return;
  }
  const JobCredentials& job = jobs_[c.job];
  Message m;
  m.type = FrameType::kHello;
  m.from_conn = h;
  m.from_address = address_;
  m.header = MakeHeader(FrameType::kHello, job.job_id, job.local_rank);
  std::memset(&m.hello, 0, sizeof(m.hello));
  m.hello.rank = job.local_rank;
  m.hello.world_size = job.world_size;
  m.hello.token_bytes = static_cast<uint16_t>(job.token.size());
  std::memcpy(m.hello.token, job.token.data(), job.token.size());
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

void FakeTransport::Reply(const Message& to, FrameType type, WireError code, const std::string& reason,
                          PeerHandle from, TimeNs now) {
  Message m;
  m.type = type;
  m.to_conn = to.from_conn;
  m.from_conn = from;
  m.code = code;
  m.reason = reason;
  m.deliver_at = now + network_->delay_;
  if (from != kNoPeer) {
    const JobCredentials& job = jobs_[conns_[from]->job];
    m.header = MakeHeader(type, job.job_id, job.local_rank);
  }
  Deliver(to.from_address, std::move(m));
}

void FakeTransport::HandleHello(Message& m, TimeNs now) {
  const int j = FindJob(m.header.job_id);
  WireError code = WireError::kNone;
  std::string reason;
  if (j < 0) {
    code = WireError::kUnknownJob;
    reason = absl::StrCat("job ", m.header.job_id, " is not registered on this daemon");
  } else if (!TokensEqual(std::span<const uint8_t>(m.hello.token, std::min<size_t>(m.hello.token_bytes, kMaxTokenBytes)),
                          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(jobs_[j].token.data()),
                                                   jobs_[j].token.size()))) {
    code = WireError::kAuthFailed;
    reason = absl::StrCat("auth token mismatch for job ", m.header.job_id);
  } else if (m.hello.world_size != jobs_[j].world_size || m.hello.rank >= jobs_[j].world_size ||
             m.hello.rank == jobs_[j].local_rank) {
    code = WireError::kBadRank;
    reason = absl::StrCat("rank ", m.hello.rank, " does not fit job ", m.header.job_id);
  }
  if (code != WireError::kNone) {
    stats_.errors[static_cast<size_t>(code)] += 1;
    Reply(m, FrameType::kReject, code, reason, kNoPeer, now);
    return;
  }
  auto c = std::make_unique<Conn>();
  c->state = State::kEstablished;
  c->inbound = true;
  c->known = true;
  c->job = j;
  c->peer_rank = m.hello.rank;
  c->remote_address = m.from_address;
  c->remote_conn = m.from_conn;
  c->last_progress = now;
  conns_.push_back(std::move(c));
  const PeerHandle h = static_cast<PeerHandle>(conns_.size() - 1);
  stats_.peers_up += 1;
  Reply(m, FrameType::kHelloOk, WireError::kNone, "", h, now);
  handler_->OnPeerUp_st(InfoOf(h));
}

void FakeTransport::Handle(Message& m, TimeNs now) {
  if (m.type == FrameType::kHello) {
    HandleHello(m, now);
    return;
  }
  Conn* c = Lookup(m.to_conn);
  if (c == nullptr || c->state == State::kDown) return;  // stale: the connection is gone
  const PeerHandle h = m.to_conn;
  c->last_progress = now;
  switch (m.type) {
    case FrameType::kHelloOk:
      if (c->state != State::kHelloSent) return;
      c->state = State::kEstablished;
      c->remote_conn = m.from_conn;
      c->peer_rank = m.header.sender_rank;
      stats_.peers_up += 1;
      handler_->OnPeerUp_st(InfoOf(h));
      return;
    case FrameType::kReject:
      if (c->state != State::kHelloSent) return;
      Down(h, WireErrorStatus(m.code, absl::StrCat("peer ", c->remote_address, " rejected the connection (",
                                                   std::string(WireErrorName(m.code)), "): ", m.reason)),
           false, now);
      return;
    case FrameType::kGoodbye:
      stats_.peer_resets += 1;
      Down(h, WireErrorStatus(m.code, absl::StrCat("peer rank ", c->peer_rank, " closed the connection (",
                                                   std::string(WireErrorName(m.code)), "): ", m.reason)),
           false, now);
      return;
    case FrameType::kData: {
      RecvTarget t = handler_->ResolveRecv_st(InfoOf(h), m.header);
      if (c->state == State::kDown) return;  // the handler disconnected it (as TCP and DPDK do)
      bool ok = t.accept && t.region < regions_.size() && regions_[t.region].used &&
                t.region_offset <= regions_[t.region].bytes &&
                m.header.length <= regions_[t.region].bytes - t.region_offset;
      if (ok) {
        if (t.by_piece) {
          const uint64_t piece = network_->piece_bytes_ == 0 ? m.header.length : network_->piece_bytes_;
          for (uint64_t off = 0; off < m.header.length; off += piece) {
            handler_->OnRecvPiece_st(InfoOf(h), m.header, t, off,
                                     std::span<const uint8_t>(m.payload.data() + off,
                                                              std::min<uint64_t>(piece, m.header.length - off)));
          }
        } else if (m.header.length > 0) {
          std::memcpy(regions_[t.region].base + t.region_offset, m.payload.data(), m.header.length);
        }
        c->stats.bytes_received += m.header.length;
        c->stats.frames_received += 1;
        stats_.total.bytes_received += m.header.length;
        stats_.total.frames_received += 1;
        handler_->OnRecvDone_st(InfoOf(h), m.header, t, now);
      } else {
        stats_.errors[static_cast<size_t>(WireError::kNoTarget)] += 1;
      }
      Message ack;
      ack.type = FrameType::kAck;
      ack.to_conn = c->remote_conn;
      ack.from_conn = h;
      ack.header = MakeAckHeader(m.header, jobs_[c->job].local_rank, !ok);
      ack.deliver_at = now + network_->delay_;
      c->stats.acks_sent += 1;
      stats_.total.acks_sent += 1;
      Deliver(c->remote_address, std::move(ack));
      return;
    }
    case FrameType::kAck: {
      if (c->unacked.empty() || c->unacked.front().header.seq != m.header.seq) return;
      const Pending p = c->unacked.front();
      c->unacked.pop_front();
      c->stats.acks_received += 1;
      stats_.total.acks_received += 1;
      const SendCompletion done{h, p.cookie, p.header.key, p.header.iteration, p.header.offset, p.header.length};
      if ((m.header.flags & kFlagAckRejected) != 0) {
        c->stats.sends_failed += 1;
        stats_.total.sends_failed += 1;
        handler_->OnSendFailed_st(done, absl::FailedPreconditionError(absl::StrFormat(
                                            "peer rank %d had no destination for key %d iteration %d",
                                            c->peer_rank, done.key, done.iteration)));
      } else {
        handler_->OnSendAcked_st(done, now);
      }
      return;
    }
    default:
      return;
  }
}

void FakeTransport::Down(PeerHandle h, const absl::Status& why, bool tell_peer, TimeNs now) {
  Conn& c = *conns_[h];
  if (c.state == State::kDown) return;
  const bool was_up = c.state == State::kEstablished;
  c.state = State::kDown;
  if (tell_peer && was_up && c.remote_conn != kNoPeer) {
    Message m;
    m.type = FrameType::kGoodbye;
    m.to_conn = c.remote_conn;
    m.code = absl::IsDeadlineExceeded(why) ? WireError::kTimeout : WireError::kShutdown;
    m.reason = std::string(why.message());
    m.deliver_at = now + network_->delay_;
    Deliver(c.remote_address, std::move(m));
  }
  auto fail = [&](std::deque<Pending>& q) {
    for (const Pending& p : q) {
      c.stats.sends_failed += 1;
      stats_.total.sends_failed += 1;
      handler_->OnSendFailed_st(SendCompletion{h, p.cookie, p.header.key, p.header.iteration,
                                               p.header.offset, p.header.length},
                                why);
    }
    q.clear();
  };
  fail(c.unacked);  // older than anything unsent
  fail(c.unsent);
  if (c.known) {
    c.known = false;
    stats_.peers_down += 1;
    handler_->OnPeerDown_st(InfoOf(h), why);
  }
}

FakeTransport::Conn* FakeTransport::Lookup(PeerHandle h) {
  return h < conns_.size() ? conns_[h].get() : nullptr;
}

PeerInfo FakeTransport::InfoOf(PeerHandle h) const {
  const Conn& c = *conns_[h];
  PeerInfo p;
  p.handle = h;
  p.job_id = c.job >= 0 ? jobs_[c.job].job_id : 0;
  p.rank = c.peer_rank;
  p.inbound = c.inbound;
  return p;
}

PeerStats FakeTransport::PeerStatsOf(PeerHandle peer) const {
  return peer < conns_.size() ? conns_[peer]->stats : PeerStats{};
}

}  // namespace gradlane::transport::fake
