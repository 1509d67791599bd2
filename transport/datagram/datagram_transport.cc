#include "transport/datagram/datagram_transport.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/common/hello.h"

namespace gradlane::transport::datagram {
namespace {

using sched::kNever;
constexpr size_t kMaxControlBytes = kDgramHeaderBytes + kFrameHeaderBytes + kMaxControlPayloadBytes;

uint32_t RoundUpPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

// ---- state ------------------------------------------------------------------------------------

struct DatagramTransport::Counters : TransportCounters {
  StatCounter datagrams_sent, datagrams_received, data_packets_sent, retransmits, timeouts,
      duplicates, out_of_order, beyond_credit, pure_acks_sent, stray, replies_suppressed, link_full;
};

enum class ConnState : uint8_t { kFree, kHelloSent, kEstablished, kDead };

struct DatagramTransport::Conn {
  ConnState state = ConnState::kFree;
  bool inbound = false;
  bool known = false;  // the engine holds a handle for it (outbound, or inbound and up)
  int job_index = -1;
  uint16_t peer_rank = 0;
  Ipv4Endpoint addr;
  std::string addr_text;
  uint32_t remote_conn = 0;
  // dialing
  TimeNs retry_at = 0, give_up_at = 0, backoff = 0;
  uint32_t hellos = 0;
  // liveness
  TimeNs last_heard = 0, last_progress = 0, last_ping = 0;
  bool restart_progress = false;
  // send side: messages (segments) in a ring indexed by message number
  std::vector<PendingSend> sends;
  uint64_t send_mask = 0;
  uint64_t msg_post = 0;   // next message number to assign
  uint64_t msg_acked = 0;  // messages below this are complete (acked or failed)
  uint64_t msg_tx = 0;     // message being cut into packets
  uint64_t msgs_sent = 0;  // messages whose last packet has gone out at least once
  uint64_t tx_off = 0;
  bool tx_started = false;
  // send side: packets
  SendWindow tx;
  // receive side: packets
  ReorderBuffer rx;
  // receive side: the segment being placed (message rx.next_message())
  bool rx_in_msg = false;
  FrameHeader rx_header{};
  RecvTarget rx_target;
  uint8_t* rx_dst = nullptr;
  uint64_t rx_got = 0;
  PeerCounters counters;

  bool HasPending() const { return msg_acked != msg_post; }
  PendingSend& Send(uint64_t m) { return sends[m & send_mask]; }
};

DatagramTransport::DatagramTransport(const TransportOptions& options,
                                     const DatagramOptions& protocol, DatagramLink* link,
                                     TransportHandler* handler)
    : options_(options),
      proto_(protocol),
      link_(link),
      handler_(handler),
      regions_(options.max_regions),
      counters_(new Counters),
      report_(handler, counters_.get()) {}

DatagramTransport::~DatagramTransport() = default;

absl::StatusOr<std::unique_ptr<DatagramTransport>> DatagramTransport::Create(
    const TransportOptions& options, const DatagramOptions& protocol, DatagramLink* link,
    TransportHandler* handler) {
  if (link == nullptr || handler == nullptr)
    return absl::InvalidArgumentError("null link or handler");
  auto t =
      std::unique_ptr<DatagramTransport>(new DatagramTransport(options, protocol, link, handler));
  if (absl::Status s = t->conns_.Init(options.max_connections); !s.ok()) return s;
  if (options.max_pending_sends_per_peer == 0 || options.max_pending_sends_per_peer > (1u << 24)) {
    return absl::InvalidArgumentError("max_pending_sends_per_peer must be 1..2^24");
  }
  if (options.max_segment_bytes == 0 || options.max_segment_bytes > 0xFFFFFFFFull) {
    return absl::InvalidArgumentError("max_segment_bytes must be 1..4 GiB-1");
  }
  if (protocol.window_packets == 0 || protocol.window_packets > kMaxWindow) {
    return absl::InvalidArgumentError(absl::StrCat("window_packets must be 1..", kMaxWindow));
  }
  if (protocol.min_rto <= 0 || protocol.initial_rto < protocol.min_rto ||
      protocol.max_rto < protocol.initial_rto) {
    return absl::InvalidArgumentError("need 0 < min_rto <= initial_rto <= max_rto");
  }
  if (absl::Status s = FaultyLink::Validate(protocol.faults); !s.ok()) return s;
  uint32_t dg = link->max_datagram_bytes();
  if (protocol.max_datagram_bytes != 0) dg = std::min(dg, protocol.max_datagram_bytes);
  if (dg < kMinDatagramBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("datagrams of ", dg, " bytes are too small (need ", kMinDatagramBytes, ")"));
  }
  t->max_dgram_ = dg;
  t->window_ = protocol.window_packets;
  t->credit_ = t->window_;
  t->proto_.ack_every = std::max<uint32_t>(1, protocol.ack_every);
  if (protocol.faults.any()) {
    // Data packets' heads are shorter than the longest control datagram: any may be reordered.
    t->faulty_ = std::make_unique<FaultyLink>(link, protocol.faults, kMaxControlBytes);
    t->link_ = t->faulty_.get();
  }
  return t;
}

// ---- control ops ------------------------------------------------------------------------------

absl::StatusOr<uint16_t> DatagramTransport::Listen_st() {
  if (listening_) return absl::FailedPreconditionError("already listening");
  listening_ = true;
  return link_->local_endpoint().port;
}

absl::Status DatagramTransport::AddJob_st(const JobCredentials& job) { return jobs_.Add(job); }

absl::Status DatagramTransport::RemoveJob_st(uint64_t job_id) {
  const absl::Status removed = jobs_.Remove(job_id, [&](int j, const absl::Status& why) {
    conns_.ForEach([&](Conn& c) {
      if (c.job_index != j || c.state == ConnState::kDead || c.state == ConnState::kFree) return;
      if (c.state == ConnState::kEstablished) {
        SendError(c.addr, c.remote_conn, &c, DgramType::kClose, job_id, jobs_[j].creds.local_rank,
                  WireError::kShutdown, "job removed");
      }
      Teardown(c, why);
    });
  });
  if (removed.ok()) link_->Flush_st();  // the closes
  return removed;
}

absl::StatusOr<PeerHandle> DatagramTransport::Connect_st(const JobCredentials& job,
                                                         std::string_view address, TimeNs now) {
  const absl::StatusOr<int> j = jobs_.FindToDial(job.job_id);
  if (!j.ok()) return j.status();
  auto ep = ParseIpv4Endpoint(address);
  if (!ep.ok()) return ep.status();
  Conn* c = AllocConn();
  if (c == nullptr) return absl::ResourceExhaustedError("no free connection slot");
  c->inbound = false;
  c->known = true;
  c->job_index = *j;
  c->addr = *ep;
  c->addr_text = std::string(address);
  c->state = ConnState::kHelloSent;
  c->give_up_at = now + options_.connect_deadline;
  c->backoff = options_.connect_initial_backoff;
  c->retry_at = now;  // first hello on the next step: never a callback inside Connect_st
  return conns_.HandleOf(*c);
}

void DatagramTransport::Disconnect_st(PeerHandle peer, TimeNs) {
  Conn* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == ConnState::kDead) return;
  if (c->state == ConnState::kEstablished) {
    const JobTable::Entry& job = jobs_[c->job_index];
    SendError(c->addr, c->remote_conn, c, DgramType::kClose, job.creds.job_id, job.creds.local_rank,
              WireError::kShutdown, "disconnected");
    link_->Flush_st();
  }
  Teardown(*c, absl::CancelledError("disconnected"));
}

absl::StatusOr<RegionId> DatagramTransport::RegisterRegion_st(void* base, uint64_t bytes) {
  return regions_.Register(base, bytes);
}

absl::Status DatagramTransport::UnregisterRegion_st(RegionId region) {
  return regions_.Unregister(region);
}

absl::Status DatagramTransport::PostSend_st(PeerHandle peer, const SendSpec& spec) {
  Conn* c = conns_.Lookup(peer);
  if (c == nullptr || c->state == ConnState::kDead)
    return absl::NotFoundError("peer is not connected");
  auto payload = regions_.ResolveSend(spec, options_.max_segment_bytes);
  if (!payload.ok()) return payload.status();
  if (c->msg_post - c->msg_acked > c->send_mask) {
    return absl::ResourceExhaustedError("too many sends pending for this peer");
  }
  const JobTable::Entry& job = jobs_[c->job_index];
  if (!c->HasPending()) c->restart_progress = true;  // the silence before this post is no stall
  PendingSend& s = c->Send(c->msg_post);
  s.header = MakeDataHeader(job.creds.job_id, job.creds.local_rank, spec);
  s.header.seq = static_cast<uint32_t>(c->msg_post);
  s.payload = *payload;
  s.cookie = spec.cookie;
  ++c->msg_post;
  return absl::OkStatus();
}

// ---- progress ---------------------------------------------------------------------------------

int DatagramTransport::Progress_st(TimeNs now, int wait_ms) {
  int work = link_->Poll_st(this, now, 0);
  conns_.ForEach([&](Conn& c) {
    const uint64_t before = c.tx.next() + c.msg_acked + c.rx.next();
    Service(c, now);
    if (c.tx.next() + c.msg_acked + c.rx.next() != before) ++work;
  });
  if (faulty_ != nullptr) faulty_->ReleaseHeld_st();
  link_->Flush_st();
  conns_.ReleaseRetired([](Conn& c) { c.state = ConnState::kFree; });
  if (work == 0 && wait_ms > 0) {
    TimeNs wait = TimeNs{wait_ms} * sched::kMillisecond;
    conns_.ForEach([&](const Conn& c) {
      if (c.state == ConnState::kHelloSent)
        wait = std::min(wait, std::max<TimeNs>(0, c.retry_at - now));
      if (c.tx.timer_at() != kNever)
        wait = std::min(wait, std::max<TimeNs>(0, c.tx.timer_at() - now));
      if (c.rx.AckPending()) wait = 0;
    });
    if (wait > 0) work += link_->Poll_st(this, now, wait);
  }
  return work;
}

void DatagramTransport::Service(Conn& c, TimeNs now) {
  if (c.state == ConnState::kHelloSent) {
    if (now < c.retry_at) return;
    if (now >= c.give_up_at) {
      Teardown(c, absl::DeadlineExceededError(absl::StrCat(
                      "could not connect to ", c.addr_text, " within ",
                      options_.connect_deadline / sched::kMillisecond, " ms: no answer to hello")));
      return;
    }
    counters_->connect_attempts.Add_st(1);
    if (c.hellos++ > 0) counters_->connect_retries.Add_st(1);
    SendHello(c);
    c.retry_at = std::min(now + c.backoff, c.give_up_at);
    c.backoff = std::min(c.backoff * 2, options_.connect_max_backoff);
    return;
  }
  if (c.state != ConnState::kEstablished) return;
  if (c.restart_progress) {
    c.restart_progress = false;
    c.last_progress = now;
  }
  // Liveness: a peer that says nothing at all (keepalives included), or that stops completing
  // our sends, for peer_timeout is down — the datagram world has no RST to tell us.
  const bool silent = now - c.last_heard > options_.peer_timeout;
  const bool stuck = c.HasPending() && now - c.last_progress > options_.peer_timeout;
  if (silent || stuck) {
    counters_->peer_timeouts.Add_st(1);
    Refuse(c, WireError::kTimeout,
           absl::DeadlineExceededError(absl::StrFormat(
               "peer rank %d %s for %d ms%s", c.peer_rank, silent ? "silent" : "made no progress",
               options_.peer_timeout / sched::kMillisecond,
               c.HasPending() ? absl::StrCat(" with ", c.msg_post - c.msg_acked, " sends pending")
                              : "")));
    return;
  }
  const TimeNs probe = std::max<TimeNs>(options_.peer_timeout / 4, sched::kMillisecond);
  if (now - c.last_heard > probe && now - c.last_ping > probe) {
    c.last_ping = now;
    SendAck(c, /*probe=*/true);
  }
  if (!Retransmit(c, now)) return;
  if (!SendNew(c, now)) return;
  if (c.rx.AckDue(now, proto_.ack_every, proto_.ack_delay)) {
    SendAck(c, /*probe=*/false);
  }
}

void DatagramTransport::SendHello(Conn& c) {
  const HelloFrame hello = MakeHello(jobs_[c.job_index].creds);
  SendControl(c.addr, 0, &c, DgramType::kHello, hello.header, &hello.body, sizeof(hello.body));
}

bool DatagramTransport::Retransmit(Conn& c, TimeNs now) {
  const SendWindow::RetransmitResult r = c.tx.Retransmit(now, [&](uint64_t seq) {
    if (!SendDataPacket(c, seq)) return SendWindow::Resend::kLinkFull;
    return c.state == ConnState::kEstablished ? SendWindow::Resend::kSent
                                              : SendWindow::Resend::kGone;
  });
  counters_->retransmits.Add_st(r.resent);
  if (r.gone) return false;
  if (r.timed_out) counters_->timeouts.Add_st(1);
  return true;
}

bool DatagramTransport::SendNew(Conn& c, TimeNs now) {
  const uint32_t first_cap = max_dgram_ - kDgramHeaderBytes - kFrameHeaderBytes;
  const uint32_t cap = max_dgram_ - kDgramHeaderBytes;
  while (c.tx.CanSendNew(window_)) {
    if (!c.tx_started) {
      if (c.msg_tx == c.msg_post) break;
      // The rejected-bit map covers kMaxWindow messages: never more unfinished than that.
      if (c.msg_tx >= c.msg_acked + kMaxWindow) break;
      c.tx_started = true;
      c.tx_off = 0;
    }
    PendingSend& m = c.Send(c.msg_tx);
    const bool first = c.tx_off == 0;
    const uint64_t left = m.header.length - c.tx_off;
    const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(first ? first_cap : cap, left));
    const bool last = len == left;
    c.tx.Stage(c.msg_tx, static_cast<uint32_t>(c.tx_off), len,
               static_cast<uint16_t>((first ? kPktFirst : 0) | (last ? kPktLast : 0)), now);
    if (!SendDataPacket(c, c.tx.next())) break;
    if (c.state != ConnState::kEstablished) return false;
    c.tx.Commit(now);
    c.tx_off += len;
    if (last) {
      c.tx_started = false;
      ++c.msg_tx;
      c.msgs_sent = c.msg_tx;
      report_.SendLeft(conns_.HandleOf(c), c.counters, m);
      if (c.state != ConnState::kEstablished) return false;
    }
  }
  return true;
}

bool DatagramTransport::SendDataPacket(Conn& c, uint64_t seq) {
  const SendWindow::Packet& p = c.tx.packet(seq);
  const PendingSend& m = c.Send(p.msg);
  struct {
    DgramHeader dh;
    FrameHeader fh;
  } head;
  static_assert(sizeof(head) == kDgramHeaderBytes + kFrameHeaderBytes);
  std::memset(&head.dh, 0, sizeof(head.dh));
  head.dh.magic = kDgramMagic;
  head.dh.version = kDgramVersion;
  head.dh.type = static_cast<uint8_t>(DgramType::kData);
  head.dh.flags = p.flags;
  head.dh.dst_conn = c.remote_conn;
  head.dh.src_conn = conns_.HandleOf(c);
  head.dh.seq = seq;
  head.dh.msg = p.msg;
  head.dh.msg_offset = p.offset;
  // The tail of the window asks for an ack at once rather than after the delay.
  if (c.tx.IsLastAllowed(seq, window_)) head.dh.flags |= kPktAckNow;
  const bool first = (p.flags & kPktFirst) != 0;
  head.dh.payload_bytes = p.len + (first ? static_cast<uint32_t>(kFrameHeaderBytes) : 0);
  const ReorderBuffer::Owed owed = c.rx.owed();
  c.rx.FillAck(head.dh, credit_);
  if (first) head.fh = m.header;
  const size_t head_bytes = kDgramHeaderBytes + (first ? kFrameHeaderBytes : 0);
  const bool ok =
      Transmit(c.addr,
               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&head), head_bytes),
               std::span<const uint8_t>(m.payload + p.offset, p.len));
  if (!ok) {
    // Not sent: the ack we meant to piggyback is still owed.
    c.rx.Restore(owed);
    return false;
  }
  counters_->data_packets_sent.Add_st(1);
  return true;
}

void DatagramTransport::SendAck(Conn& c, bool probe) {
  DgramHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kDgramMagic;
  h.version = kDgramVersion;
  h.type = static_cast<uint8_t>(DgramType::kAck);
  h.dst_conn = c.remote_conn;
  h.src_conn = conns_.HandleOf(c);
  if (probe) h.flags |= kPktAckNow;  // a keepalive: the peer answers at once
  const ReorderBuffer::Owed owed = c.rx.owed();
  c.rx.FillAck(h, credit_);
  if (Transmit(c.addr, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&h), sizeof(h)),
               {})) {
    counters_->pure_acks_sent.Add_st(1);
  } else {
    c.rx.Restore(owed);
    c.rx.AckNow();
  }
}

bool DatagramTransport::SendControl(const Ipv4Endpoint& to, uint32_t dst_conn, Conn* c,
                                    DgramType type, const FrameHeader& fh, const void* body,
                                    size_t body_bytes) {
  std::array<uint8_t, kMaxControlBytes> buf;
  DgramHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kDgramMagic;
  h.version = kDgramVersion;
  h.type = static_cast<uint8_t>(type);
  h.dst_conn = dst_conn;
  h.src_conn = c != nullptr ? conns_.HandleOf(*c) : 0;
  h.credit = credit_;
  h.payload_bytes = static_cast<uint32_t>(kFrameHeaderBytes + body_bytes);
  if (c != nullptr && c->state == ConnState::kEstablished) c->rx.FillAck(h, credit_);
  std::memcpy(buf.data(), &h, sizeof(h));
  std::memcpy(buf.data() + sizeof(h), &fh, sizeof(fh));
  if (body_bytes > 0) std::memcpy(buf.data() + sizeof(h) + sizeof(fh), body, body_bytes);
  return Transmit(to, std::span<const uint8_t>(buf.data(), sizeof(h) + sizeof(fh) + body_bytes),
                  {});
}

void DatagramTransport::SendError(const Ipv4Endpoint& to, uint32_t dst_conn, Conn* c,
                                  DgramType type, uint64_t job_id, uint16_t rank, WireError code,
                                  std::string_view reason) {
  const ErrorFrame f =
      MakeErrorFrame(type == DgramType::kReject ? FrameType::kReject : FrameType::kGoodbye, job_id,
                     rank, code, reason);
  SendControl(to, dst_conn, c, type, f.header, &f.payload, f.header.payload_bytes);
  // Nothing retransmits a close (its connection is gone here), so it goes twice: one lost
  // datagram should not leave the peer to find out by timeout.
  if (type == DgramType::kClose && c != nullptr) {
    SendControl(to, dst_conn, c, type, f.header, &f.payload, f.header.payload_bytes);
  }
}

bool DatagramTransport::MayAnswerStranger(TimeNs now) {
  // A token bucket: kStrangerReplyBurst at once, kStrangerRepliesPerSecond after that. Whoever
  // floods the port with hellos or stray datagrams (from any source address, spoofed or not)
  // gets at most that many answers, so the daemon neither burns its loop on them nor reflects
  // a flood at someone else. Real peers see a reject or close at once, or retry.
  const double refill =
      static_cast<double>(now - stranger_tokens_at_) * kStrangerRepliesPerSecond / sched::kSecond;
  stranger_tokens_ =
      std::min<double>(kStrangerReplyBurst, stranger_tokens_ + std::max(0.0, refill));
  stranger_tokens_at_ = now;
  if (stranger_tokens_ < 1) {
    counters_->replies_suppressed.Add_st(1);
    return false;
  }
  stranger_tokens_ -= 1;
  return true;
}

bool DatagramTransport::Transmit(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                                 std::span<const uint8_t> body) {
  if (!link_->Send_st(to, head, body)) {
    counters_->link_full.Add_st(1);
    return false;
  }
  // With faults injected, what reached the wire is the injector's count (drops and holds are
  // "sent" here, duplicates are extra).
  if (faulty_ == nullptr) counters_->datagrams_sent.Add_st(1);
  return true;
}

// ---- receive ----------------------------------------------------------------------------------

void DatagramTransport::OnDatagram_st(const Ipv4Endpoint& from, std::span<const uint8_t> bytes,
                                      TimeNs now) {
  counters_->datagrams_received.Add_st(1);
  DgramHeader dh;
  if (bytes.size() < sizeof(dh)) {
    report_.CountError(WireError::kBadLength);
    return;
  }
  std::memcpy(&dh, bytes.data(), sizeof(dh));
  // Malformed datagrams are dropped and counted, never answered: anyone can send us a packet.
  if (dh.magic != kDgramMagic) return report_.CountError(WireError::kBadMagic);
  if (dh.version != kDgramVersion) return report_.CountError(WireError::kBadVersion);
  if (dh.type < 1 || dh.type > kMaxDgramType) return report_.CountError(WireError::kBadType);
  if ((dh.flags & ~kKnownPktFlags) != 0) return report_.CountError(WireError::kUnknownFlags);
  if (dh.payload_bytes != bytes.size() - sizeof(dh) || dh.reserved != 0)
    return report_.CountError(WireError::kBadLength);
  const std::span<const uint8_t> body = bytes.subspan(sizeof(dh));
  const DgramType type = static_cast<DgramType>(dh.type);
  if (type == DgramType::kHello) {
    OnHello(from, dh, body, now);
    return;
  }
  Conn* c = conns_.Lookup(dh.dst_conn);
  const bool match = c != nullptr && c->state != ConnState::kDead && c->addr == from &&
                     (c->remote_conn == dh.src_conn ||
                      (c->state == ConnState::kHelloSent &&
                       (type == DgramType::kHelloOk || type == DgramType::kReject)));
  if (!match) {
    counters_->stray.Add_st(1);
    // Our hello-ok was lost and the acceptor already talks on the connection: the next hello
    // fixes it; closing it would kill a connection the acceptor rightly thinks is up.
    if (c != nullptr && c->state == ConnState::kHelloSent && c->addr == from) return;
    // Like a TCP RST: a peer still talking to a connection we closed (or forgot in a restart)
    // learns at once. Never answer a close or reject, so two ends cannot ping-pong.
    if (type != DgramType::kClose && type != DgramType::kReject && dh.src_conn != 0 &&
        MayAnswerStranger(now)) {
      SendError(from, dh.src_conn, nullptr, DgramType::kClose, 0, 0, WireError::kShutdown,
                "no such connection (closed or restarted)");
    }
    return;
  }
  switch (type) {
    case DgramType::kHelloOk:
      if (c->state == ConnState::kHelloSent) OnHelloOk(*c, dh, body, now);
      return;  // a duplicate ok on an established connection: nothing to do
    case DgramType::kReject:
      OnCloseOrReject(*c, dh, body);
      return;
    case DgramType::kClose:
      // A close carries the closer's final acknowledgements: sends it had placed complete as
      // acknowledged rather than fail with the connection (TCP delivers acks before the FIN too).
      if (c->state == ConnState::kEstablished && !OnAckFields(*c, dh, now)) return;
      OnCloseOrReject(*c, dh, body);
      return;
    case DgramType::kData:
    case DgramType::kAck:
      break;
    default:
      return;
  }
  if (c->state != ConnState::kEstablished) return;  // data before our hello-ok: resent later
  c->last_heard = now;
  if (!OnAckFields(*c, dh, now)) return;
  if ((dh.flags & kPktAckNow) != 0) c->rx.AckNow();
  if (type == DgramType::kData) OnData(*c, dh, body, now);
}

void DatagramTransport::OnHello(const Ipv4Endpoint& from, const DgramHeader& dh,
                                std::span<const uint8_t> body, TimeNs now) {
  if (!listening_) return;  // like a closed port: the dialer retries until its deadline
  FrameHeader fh;
  HelloBody b;
  if (body.size() != sizeof(fh) + sizeof(b) || dh.src_conn == 0)
    return report_.CountError(WireError::kBadLength);
  std::memcpy(&fh, body.data(), sizeof(fh));
  std::memcpy(&b, body.data() + sizeof(fh), sizeof(b));
  auto reject = [&](WireError code, const std::string& why) {
    report_.CountError(code);
    if (MayAnswerStranger(now))
      SendError(from, dh.src_conn, nullptr, DgramType::kReject, fh.job_id, 0, code, why);
  };
  if (WireError e = CheckHeader(fh, options_.max_segment_bytes); e != WireError::kNone) {
    return reject(e, std::string(ValidateHeader(fh, options_.max_segment_bytes).message()));
  }
  if (TypeOf(fh) != FrameType::kHello)
    return reject(WireError::kUnexpectedFrame, "hello datagram without a hello");
  // Well formed before anything is answered, a repeated hello included (CheckHello checks it too).
  if (WireError e = CheckHelloBody(b); e != WireError::kNone)
    return reject(e, "malformed hello body");
  // A repeated hello (our hello-ok was lost): answer again, same connection.
  Conn* again = nullptr;
  conns_.ForEach([&](Conn& c) {
    if (again == nullptr && c.inbound && c.state == ConnState::kEstablished && c.addr == from &&
        c.remote_conn == dh.src_conn) {
      again = &c;
    }
  });
  if (again != nullptr) {
    const JobCredentials& job = jobs_[again->job_index].creds;
    SendControl(from, dh.src_conn, again, DgramType::kHelloOk,
                MakeHeader(FrameType::kHelloOk, job.job_id, job.local_rank), nullptr, 0);
    return;
  }
  // Job known, token, rank: the checks (and refusals) of every backend.
  const HandshakeCheck check = CheckHello(jobs_, fh, b);
  if (!check.ok()) return reject(check.code, std::string(check.status.message()));
  const int j = check.job_index;
  const JobCredentials& job = jobs_[j].creds;
  Conn* c = AllocConn();
  if (c == nullptr) {
    counters_->accepts_refused.Add_st(1);
    return;  // the dialer retries; a slot may free up
  }
  c->inbound = true;
  c->known = true;
  c->job_index = j;
  c->peer_rank = b.rank;
  c->addr = from;
  c->addr_text = FormatEndpoint(from);
  c->remote_conn = dh.src_conn;
  c->tx.SetInitialCredit(dh.credit);
  c->state = ConnState::kEstablished;
  c->last_heard = c->last_progress = now;
  ++inbound_up_;
  UpdateCredit();
  SendControl(from, dh.src_conn, c, DgramType::kHelloOk,
              MakeHeader(FrameType::kHelloOk, job.job_id, job.local_rank), nullptr, 0);
  report_.PeerUp(InfoOf(*c));
}

void DatagramTransport::OnHelloOk(Conn& c, const DgramHeader& dh, std::span<const uint8_t> body,
                                  TimeNs now) {
  FrameHeader fh;
  if (body.size() != sizeof(fh)) return report_.CountError(WireError::kBadLength);
  std::memcpy(&fh, body.data(), sizeof(fh));
  const JobCredentials& job = jobs_[c.job_index].creds;
  c.remote_conn = dh.src_conn;
  if (CheckHeader(fh, options_.max_segment_bytes) != WireError::kNone ||
      TypeOf(fh) != FrameType::kHelloOk) {
    return Refuse(c, WireError::kUnexpectedFrame, absl::InvalidArgumentError("malformed hello-ok"));
  }
  if (const HandshakeCheck ok = CheckHelloOk(job, fh); !ok.ok())
    return Refuse(c, ok.code, ok.status);
  c.peer_rank = fh.sender_rank;
  c.tx.SetInitialCredit(dh.credit);
  c.state = ConnState::kEstablished;
  c.last_heard = c.last_progress = now;
  report_.PeerUp(InfoOf(c));
}

void DatagramTransport::OnCloseOrReject(Conn& c, const DgramHeader& dh,
                                        std::span<const uint8_t> body) {
  // The FrameHeader, then the ErrorBody and its reason (none, or cut short: code kNone).
  const PeerError error =
      ParseErrorPayload(body.size() >= kFrameHeaderBytes ? body.subspan(kFrameHeaderBytes)
                                                         : std::span<const uint8_t>());
  const std::string peer = c.inbound ? absl::StrCat("rank ", c.peer_rank) : c.addr_text;
  const bool reject = static_cast<DgramType>(dh.type) == DgramType::kReject;
  if (!reject && c.state == ConnState::kEstablished) counters_->peer_resets.Add_st(1);
  Teardown(c, PeerClosedStatus(reject ? FrameType::kReject : FrameType::kGoodbye, error, peer));
}

bool DatagramTransport::OnAckFields(Conn& c, const DgramHeader& dh, TimeNs now) {
  if (dh.ack > c.tx.next() || dh.msg_ack > c.msgs_sent || dh.credit > kMaxWindow) {
    Refuse(c, WireError::kBadField,
           absl::InvalidArgumentError(
               absl::StrFormat("ack %d / message ack %d beyond what was sent (%d / %d)", dh.ack,
                               dh.msg_ack, c.tx.next(), c.msgs_sent)));
    return false;
  }
  const SendWindow::AckResult ack = c.tx.OnAck(dh.ack, dh.sack, dh.credit, now);
  if (ack.stale) return true;  // an older header overtaken by a newer one
  if (ack.advanced) c.last_progress = now;
  while (c.msg_acked < dh.msg_ack) {
    const uint64_t m = c.msg_acked++;
    c.last_progress = now;
    report_.SendAcked(conns_.HandleOf(c), c.peer_rank, c.counters, c.Send(m),
                      BitTest(dh.rejected, m), now);
    if (c.state != ConnState::kEstablished) return false;
  }
  return true;
}

bool DatagramTransport::OnData(Conn& c, const DgramHeader& dh, std::span<const uint8_t> body,
                               TimeNs now) {
  ReorderBuffer::Packet p{dh.flags, dh.msg, dh.msg_offset, body};
  switch (c.rx.OnPacket(dh.seq, p, now)) {
    case ReorderBuffer::Verdict::kDuplicate:
      counters_->duplicates.Add_st(1);
      return true;
    case ReorderBuffer::Verdict::kBeyondCapacity:
      counters_->beyond_credit.Add_st(1);
      return true;
    case ReorderBuffer::Verdict::kHeld:
      counters_->out_of_order.Add_st(1);
      return true;
    case ReorderBuffer::Verdict::kInOrder:
      break;
  }
  // In order: straight from the link's buffer to its destination, then whatever it unblocked.
  do {
    if (!Deliver(c, p.flags, p.msg, p.msg_offset, p.bytes, now)) return false;
    c.rx.Consumed();
  } while (c.rx.NextHeld(&p));
  return true;
}

bool DatagramTransport::Deliver(Conn& c, uint16_t flags, uint64_t msg, uint32_t msg_offset,
                                std::span<const uint8_t> bytes, TimeNs now) {
  auto violation = [&](WireError code, std::string_view what) {
    Refuse(c, code,
           absl::InvalidArgumentError(
               absl::StrCat("peer rank ", c.peer_rank, ": ", std::string(what))));
    return false;
  };
  if ((flags & kPktFirst) != 0) {
    if (c.rx_in_msg || msg != c.rx.next_message())
      return violation(WireError::kUnexpectedFrame, "segment out of order");
    if (bytes.size() < kFrameHeaderBytes)
      return violation(WireError::kBadLength, "first packet without a header");
    FrameHeader& h = c.rx_header;
    std::memcpy(&h, bytes.data(), sizeof(h));
    bytes = bytes.subspan(kFrameHeaderBytes);
    if (WireError e = CheckHeader(h, options_.max_segment_bytes); e != WireError::kNone) {
      Refuse(c, e, ValidateHeader(h, options_.max_segment_bytes));
      return false;
    }
    if (TypeOf(h) != FrameType::kData)
      return violation(WireError::kUnexpectedFrame, "non-data frame in the data stream");
    if (h.job_id != jobs_[c.job_index].creds.job_id)
      return violation(WireError::kUnknownJob, "frame for another job");
    c.rx_in_msg = true;
    c.rx_got = 0;
    c.rx_target = handler_->ResolveRecv_st(InfoOf(c), h);
    if (c.state != ConnState::kEstablished) return false;
    const std::optional<uint8_t*> dst = regions_.ResolveRecv(c.rx_target, h.length);
    if (dst.has_value()) {
      c.rx_dst = *dst;
    } else {
      c.rx_target.accept = false;
      report_.CountError(WireError::kNoTarget);
    }
  } else if (!c.rx_in_msg || msg != c.rx.next_message()) {
    return violation(WireError::kUnexpectedFrame, "continuation of a segment not started");
  }
  const FrameHeader& h = c.rx_header;
  if (msg_offset != c.rx_got || bytes.size() > h.length - c.rx_got) {
    return violation(WireError::kBadLength, "packet does not continue its segment");
  }
  if (c.rx_target.accept && !bytes.empty()) {
    if (c.rx_target.by_piece) {
      handler_->OnRecvPiece_st(InfoOf(c), h, c.rx_target, msg_offset, bytes);
    } else {
      std::memcpy(c.rx_dst + msg_offset, bytes.data(), bytes.size());
    }
  }
  c.rx_got += bytes.size();
  if ((flags & kPktLast) == 0) return true;
  if (c.rx_got != h.length) return violation(WireError::kBadLength, "segment ended short");
  c.rx_in_msg = false;
  const bool accepted = c.rx_target.accept;
  c.rx.CompleteMessage(accepted);
  report_.AckSent(c.counters);
  if (accepted) {
    report_.Received(InfoOf(c), c.counters, h, c.rx_target, now);
    if (c.state != ConnState::kEstablished) return false;
  }
  return true;
}

// ---- teardown ---------------------------------------------------------------------------------

void DatagramTransport::Refuse(Conn& c, WireError code, const absl::Status& why) {
  if (code != WireError::kShutdown) report_.CountError(code);
  if (c.state == ConnState::kEstablished || c.state == ConnState::kHelloSent) {
    const JobTable::Entry& job = jobs_[c.job_index];
    if (c.remote_conn != 0) {
      SendError(c.addr, c.remote_conn, &c, DgramType::kClose, job.creds.job_id,
                job.creds.local_rank, code,
                std::string_view(why.message().data(), why.message().size()));
    }
  }
  Teardown(c, why);
}

void DatagramTransport::UpdateCredit() {
  const uint32_t budget = proto_.rx_budget_packets;
  if (budget == 0) {
    credit_ = window_;
    return;
  }
  // Granted credit cannot be taken back (a sender's limit only grows), so a newcomer squeezes
  // the others only as their acks move on: the budget is met from then on, not at once.
  credit_ = std::clamp<uint32_t>(budget / std::max<uint32_t>(1, inbound_up_),
                                 std::min<uint32_t>(8, window_), window_);
}

void DatagramTransport::Teardown(Conn& c, const absl::Status& why) {
  if (c.state == ConnState::kDead || c.state == ConnState::kFree) return;
  if (c.inbound && c.state == ConnState::kEstablished) {
    --inbound_up_;
    UpdateCredit();
  }
  c.state = ConnState::kDead;
  FailPendingAndReportDown(c, why);
  conns_.Retire(c);
}

void DatagramTransport::FailPendingAndReportDown(Conn& c, const absl::Status& why) {
  // Pending in post order: messages [msg_acked, msg_post).
  report_.FailPendingAndReportDown(
      InfoOf(c), c.known, c.counters,
      [&c]() -> const PendingSend* {
        return c.msg_acked != c.msg_post ? &c.Send(c.msg_acked++) : nullptr;
      },
      why);
}

DatagramTransport::Conn* DatagramTransport::AllocConn() {
  Conn* slot = conns_.Alloc();
  if (slot == nullptr) return nullptr;
  Conn& c = *slot;
  if (c.sends.empty()) {
    // First use of this slot: size its rings once; later uses reuse them.
    const uint32_t n = RoundUpPow2(options_.max_pending_sends_per_peer);
    c.sends.resize(n);
    c.send_mask = n - 1;
    c.tx.Init();
    c.rx.Init(window_, max_dgram_ - kDgramHeaderBytes);
  }
  c.inbound = c.known = false;
  c.job_index = -1;
  c.peer_rank = 0;
  c.addr = {};
  c.addr_text.clear();
  c.remote_conn = 0;
  c.retry_at = c.give_up_at = c.backoff = 0;
  c.hellos = 0;
  c.restart_progress = false;
  c.last_heard = c.last_progress = c.last_ping = 0;
  c.msg_post = c.msg_acked = c.msg_tx = c.msgs_sent = c.tx_off = 0;
  c.tx_started = false;
  c.tx.Reset(
      SendWindow::Timing{proto_.initial_rto, proto_.min_rto, proto_.max_rto, proto_.rto_burst});
  c.rx.Reset();
  c.rx_in_msg = false;
  c.rx_dst = nullptr;
  c.rx_got = 0;
  c.counters.Reset_st();
  return &c;
}

PeerInfo DatagramTransport::InfoOf(const Conn& c) const {
  return jobs_.PeerInfoOf(conns_.HandleOf(c), c.job_index, c.peer_rank, c.inbound);
}

// ---- stats ------------------------------------------------------------------------------------

TransportStats DatagramTransport::Stats() const { return counters_->Snapshot(); }

PeerStats DatagramTransport::PeerStatsOf(PeerHandle peer) const {
  // Any thread: the generation check, then the counters (atomics). A slot recycled between the
  // two reads yields the new connection's (reset) counters.
  const Conn* c = conns_.LookupAnyThread(peer);
  return c != nullptr ? c->counters.Snapshot() : PeerStats{};
}

DatagramStats DatagramTransport::DatagramStatsNow() const {
  const Counters& k = *counters_;
  DatagramStats s;
  const FaultStats f = faulty_ != nullptr ? faulty_->Stats() : FaultStats{};
  s.datagrams_sent = k.datagrams_sent.Get() + f.sent;
  s.datagrams_received = k.datagrams_received.Get();
  s.data_packets_sent = k.data_packets_sent.Get();
  s.retransmits = k.retransmits.Get();
  s.timeouts = k.timeouts.Get();
  s.duplicates = k.duplicates.Get();
  s.out_of_order = k.out_of_order.Get();
  s.beyond_credit = k.beyond_credit.Get();
  s.pure_acks_sent = k.pure_acks_sent.Get();
  s.stray = k.stray.Get();
  s.replies_suppressed = k.replies_suppressed.Get();
  s.injected_drops = f.drops;
  s.injected_reorders = f.reorders;
  s.injected_duplicates = f.duplicates;
  s.link_full = k.link_full.Get();
  return s;
}

}  // namespace gradlane::transport::datagram
