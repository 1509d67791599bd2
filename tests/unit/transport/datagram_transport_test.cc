// The reliable datagram protocol (transport/datagram/datagram_transport.h) over an in-memory pipe
// on virtual time: handshake and refusals, bit-exact delivery of segments of every size, loss,
// reordering and duplication (injected by the transport and by the pipe), a peer that vanishes,
// a full window, exhausted credits, a full link, resolver rejection, malformed datagrams.
#include "transport/datagram/datagram_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "recording_handler.h"

namespace gradlane::transport::datagram {
namespace {

using testing::RecordingHandler;
constexpr TimeNs kUs = sched::kMicrosecond;
constexpr TimeNs kMs = sched::kMillisecond;

class Pipe;

// One end of the pipe. Datagrams are copied on Send_st and delivered `delay` later.
class PipeLink final : public DatagramLink {
 public:
  PipeLink(Pipe* pipe, Ipv4Endpoint self, uint32_t mtu) : pipe_(pipe), self_(self), mtu_(mtu) {}
  uint32_t max_datagram_bytes() const override { return mtu_; }
  Ipv4Endpoint local_endpoint() const override { return self_; }
  bool Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
               std::span<const uint8_t> body) override;
  void Flush_st() override {}
  int Poll_st(DatagramSink* sink, TimeNs now, TimeNs) override {
    int n = 0;
    while (!inbox_.empty() && inbox_.front().at <= now && !paused) {
      Item it = std::move(inbox_.front());
      inbox_.pop_front();
      sink->OnDatagram_st(it.from, it.bytes, now);
      ++n;
    }
    return n;
  }

  struct Item {
    TimeNs at;
    Ipv4Endpoint from;
    std::vector<uint8_t> bytes;
  };
  std::deque<Item> inbox_;
  bool paused = false;       // stops reading (a stalled receiver); datagrams queue
  bool vanished = false;     // drops everything to and from it
  int tx_budget = -1;        // datagrams accepted before Send_st says "full" (-1: unlimited)
  int drop_type = 0;         // drop the next datagram of this DgramType (0: none), once
  int drop_type_always = 0;  // drop every datagram of this DgramType
  uint64_t sent = 0;
  uint64_t data_sent = 0;

 private:
  Pipe* pipe_;
  Ipv4Endpoint self_;
  uint32_t mtu_;
};

class Pipe {
 public:
  TimeNs now = 1000 * kMs;
  TimeNs delay = 20 * kUs;
  double loss = 0;  // pipe-level random loss, on top of the transports' own injection
  // Each sender's link rate in bytes per microsecond (0: unlimited): with a rate, datagrams
  // queue behind each other as in a slow link's queue, so RTT grows with what is in flight.
  double bytes_per_us = 0;
  std::mt19937_64 rng{7};
  std::map<uint64_t, PipeLink*> links;
  std::map<uint64_t, TimeNs> link_free_at;

  static uint64_t Key(const Ipv4Endpoint& e) { return uint64_t{e.ip} << 16 | e.port; }

  void Deliver(const Ipv4Endpoint& from, const Ipv4Endpoint& to, std::vector<uint8_t> bytes) {
    auto it = links.find(Key(to));
    if (it == links.end() || it->second->vanished) return;
    if (loss > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < loss) return;
    TimeNs at = now + delay;
    if (bytes_per_us > 0) {
      TimeNs& free_at = link_free_at[Key(from)];
      free_at = std::max(free_at, now) +
                static_cast<TimeNs>(static_cast<double>(bytes.size()) / bytes_per_us * 1000);
      at = free_at + delay;
    }
    it->second->inbox_.push_back(PipeLink::Item{at, from, std::move(bytes)});
  }
};

bool PipeLink::Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
                       std::span<const uint8_t> body) {
  if (tx_budget == 0) return false;
  if (tx_budget > 0) --tx_budget;
  ++sent;
  DgramHeader h;
  std::memcpy(&h, head.data(), sizeof(h));
  if (h.type == static_cast<uint8_t>(DgramType::kData)) ++data_sent;
  if (vanished) return true;
  if (drop_type_always != 0 && h.type == drop_type_always) return true;
  if (drop_type != 0 && h.type == drop_type) {
    drop_type = 0;
    return true;
  }
  std::vector<uint8_t> bytes(head.begin(), head.end());
  bytes.insert(bytes.end(), body.begin(), body.end());
  pipe_->Deliver(self_, to, std::move(bytes));
  return true;
}

// One daemon: link + handler + transport + a registered buffer.
struct Node {
  Node(Pipe* pipe, uint32_t ip, uint32_t mtu, const TransportOptions& o, const DatagramOptions& r,
       uint64_t buffer_bytes = 4 << 20)
      : link(pipe, Ipv4Endpoint{ip, 7610}, mtu), buf(buffer_bytes) {
    pipe->links[Pipe::Key(link.local_endpoint())] = &link;
    auto t = DatagramTransport::Create(o, r, &link, &handler);
    EXPECT_TRUE(t.ok()) << t.status();
    transport = std::move(*t);
    EXPECT_TRUE(transport->Listen_st().ok());
    region = *transport->RegisterRegion_st(buf.data(), buf.size());
  }
  PipeLink link;
  RecordingHandler handler;
  std::unique_ptr<DatagramTransport> transport;
  std::vector<uint8_t> buf;
  RegionId region = kNoRegion;
};

TransportOptions Opts() {
  TransportOptions o;
  o.peer_timeout = 200 * kMs;
  o.connect_initial_backoff = 2 * kMs;
  o.connect_max_backoff = 20 * kMs;
  o.connect_deadline = 300 * kMs;
  return o;
}

JobCredentials Job(uint16_t rank, std::string token = "secret") {
  return JobCredentials{42, rank, 2, token};
}

class ReliableTest : public ::testing::Test {
 protected:
  void Make(const DatagramOptions& ra = {}, const DatagramOptions& rb = {}, uint32_t mtu = 1500,
            TransportOptions o = Opts()) {
    a = std::make_unique<Node>(&pipe, 0x0A000001, mtu, o, ra);
    b = std::make_unique<Node>(&pipe, 0x0A000002, mtu, o, rb);
    ASSERT_TRUE(a->transport->AddJob_st(Job(0)).ok());
    ASSERT_TRUE(b->transport->AddJob_st(Job(1)).ok());
    // b places every segment at its tensor offset in its buffer.
    b->handler.resolve = [this](const PeerInfo&, const FrameHeader& h) {
      return RecvTarget::Into(b->region, h.offset, h.key);
    };
  }

  void Step(TimeNs dt = 10 * kUs) {
    pipe.now += dt;
    a->transport->Progress_st(pipe.now, 0);
    b->transport->Progress_st(pipe.now, 0);
  }

  template <class Pred>
  bool RunUntil(Pred done, TimeNs limit = 5 * sched::kSecond) {
    const TimeNs end = pipe.now + limit;
    while (!done()) {
      if (pipe.now > end) return false;
      Step();
    }
    return true;
  }

  PeerHandle ConnectAB() {
    auto h = a->transport->Connect_st(Job(0), "10.0.0.2:7610", pipe.now);
    EXPECT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(RunUntil([&] { return !a->handler.up.empty() && !b->handler.up.empty(); }));
    return *h;
  }

  SendSpec Spec(uint64_t offset, uint64_t length, uint64_t cookie) {
    SendSpec s;
    s.key = cookie;
    s.offset = offset;
    s.length = length;
    s.region = a->region;
    s.region_offset = offset;
    s.cookie = cookie;
    return s;
  }

  void FillRandom(std::vector<uint8_t>& v, uint64_t seed) {
    std::mt19937_64 r(seed);
    for (auto& x : v) x = static_cast<uint8_t>(r());
  }

  // Sends `sizes` back to back from a's buffer to the same offsets of b's; checks every byte,
  // post-order completion and delivery.
  void TransferAndCheck(PeerHandle h, const std::vector<uint64_t>& sizes) {
    FillRandom(a->buf, 99);
    uint64_t off = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(a->transport->PostSend_st(h, Spec(off, sizes[i], i)).ok());
      off += sizes[i];
    }
    ASSERT_LE(off, a->buf.size());
    ASSERT_TRUE(
        RunUntil([&] { return a->handler.acked.size() + a->handler.failed.size() == sizes.size(); },
                 30 * sched::kSecond))
        << "acked " << a->handler.acked.size();
    ASSERT_TRUE(a->handler.failed.empty()) << a->handler.failed[0].second;
    ASSERT_EQ(b->handler.received.size(), sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(a->handler.acked[i].cookie, i);
      EXPECT_EQ(b->handler.received[i].header.key, i);
      EXPECT_EQ(b->handler.received[i].header.length, sizes[i]);
    }
    EXPECT_EQ(a->handler.done.size(), sizes.size());
    EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), off)) << "payload differs";
  }

  Pipe pipe;
  std::unique_ptr<Node> a, b;
};

const std::vector<uint64_t> kSizes = {
    0, 1, 1500 - 128 - 64, 1500 - 128 - 63, 1500, 4096, 100000, 1 << 20, 3, 777777};

TEST_F(ReliableTest, HandshakeAndBitExactDelivery) {
  Make();
  const PeerHandle h = ConnectAB();
  EXPECT_EQ(a->handler.up[0].rank, 1);
  EXPECT_FALSE(a->handler.up[0].inbound);
  EXPECT_EQ(b->handler.up[0].rank, 0);
  EXPECT_TRUE(b->handler.up[0].inbound);
  TransferAndCheck(h, kSizes);
  const auto rs = a->transport->DatagramStatsNow();
  EXPECT_EQ(rs.retransmits, 0u);
  // 1 MiB in 1500-byte datagrams: segmented, not one datagram.
  EXPECT_GT(rs.data_packets_sent, (1u << 20) / 1372);
  const auto st = a->transport->Stats();
  EXPECT_EQ(st.total.frames_sent, kSizes.size());
  EXPECT_EQ(st.total.acks_received, kSizes.size());
  EXPECT_EQ(b->transport->Stats().total.frames_received, kSizes.size());
}

TEST_F(ReliableTest, JumboDatagramsCarryMorePerPacket) {
  Make({}, {}, 9000);
  const PeerHandle h = ConnectAB();
  TransferAndCheck(h, {1 << 20});
  EXPECT_LE(a->transport->DatagramStatsNow().data_packets_sent, (1u << 20) / (9000 - 128 - 64) + 2);
}

TEST_F(ReliableTest, WrongTokenIsRejected) {
  Make();
  // Re-registering a served job id is refused (as over TCP): replace the job's credentials.
  EXPECT_EQ(a->transport->AddJob_st(Job(0, "wrong")).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(a->transport->RemoveJob_st(Job(0).job_id).ok());
  ASSERT_TRUE(a->transport->AddJob_st(Job(0, "wrong")).ok());
  auto h = a->transport->Connect_st(Job(0, "wrong"), "10.0.0.2:7610", pipe.now);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }));
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kPermissionDenied)
      << a->handler.down[0].second;
  EXPECT_TRUE(b->handler.up.empty());
  EXPECT_EQ(b->transport->Stats().errors[static_cast<size_t>(WireError::kAuthFailed)], 1u);
}

TEST_F(ReliableTest, UnknownJobAndBadRankAreRejected) {
  Make();
  JobCredentials other{43, 0, 2, "secret"};
  ASSERT_TRUE(a->transport->AddJob_st(other).ok());
  ASSERT_TRUE(a->transport->Connect_st(other, "10.0.0.2:7610", pipe.now).ok());
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }));
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kNotFound);
  // Same rank as the acceptor.
  ASSERT_TRUE(a->transport->RemoveJob_st(Job(1).job_id).ok());
  ASSERT_TRUE(a->transport->AddJob_st(Job(1)).ok());
  ASSERT_TRUE(a->transport->Connect_st(Job(1), "10.0.0.2:7610", pipe.now).ok());
  ASSERT_TRUE(RunUntil([&] { return a->handler.down.size() == 2; }));
  EXPECT_EQ(a->handler.down[1].second.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(b->handler.up.empty());
}

TEST_F(ReliableTest, NobodyListeningHitsConnectDeadline) {
  Make();
  auto h = a->transport->Connect_st(Job(0), "10.0.0.9:7610", pipe.now);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }, sched::kSecond));
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GT(a->transport->Stats().connect_retries, 2u);
  EXPECT_FALSE(a->transport->Connect_st(Job(0), "nonsense", pipe.now).ok());
  EXPECT_FALSE(a->transport->Connect_st(Job(0), "10.0.0.2:0", pipe.now).ok());
}

TEST_F(ReliableTest, SurvivesInjectedLossReorderAndDuplication) {
  DatagramOptions r;
  r.faults.drop_every = 7;
  r.faults.drop_probability = 0.05;
  r.faults.reorder_probability = 0.1;
  r.faults.duplicate_probability = 0.05;
  r.faults.seed = 3;
  DatagramOptions rb = r;
  rb.faults.seed = 4;
  Make(r, rb);
  const PeerHandle h = ConnectAB();
  TransferAndCheck(h, kSizes);
  const auto ra = a->transport->DatagramStatsNow();
  EXPECT_GT(ra.injected_drops, 0u);
  EXPECT_GT(ra.injected_reorders, 0u);
  EXPECT_GT(ra.injected_duplicates, 0u);
  EXPECT_GT(ra.retransmits, 0u);
  const auto rbs = b->transport->DatagramStatsNow();
  EXPECT_GT(rbs.out_of_order, 0u);
  EXPECT_GT(rbs.duplicates, 0u);
}

TEST_F(ReliableTest, SurvivesHeavyPipeLossInBothDirections) {
  Make();
  const PeerHandle h = ConnectAB();
  pipe.loss = 0.3;
  TransferAndCheck(h, {1 << 20, 5, 200000});
  EXPECT_GT(a->transport->DatagramStatsNow().timeouts, 0u);
}

TEST_F(ReliableTest, RtoAdaptsToRtt) {
  Make();
  pipe.delay = 2 * kMs;  // RTT 4 ms, above the 1 ms floor
  const PeerHandle h = ConnectAB();
  TransferAndCheck(h, {100000, 100000});
  // No spurious retransmission although the initial RTO (5 ms) is near the RTT.
  EXPECT_EQ(a->transport->DatagramStatsNow().retransmits, 0u);
}

// A full window queued on a slow link: the last packet's RTT (18 ms: 256 jumbo packets at
// 1 Gbit/s) is far above the RTO (pinned at 1 ms here, as when a queue builds faster than the
// estimate follows it), but acks keep arriving, so nothing is presumed lost (the timer restarts
// on each ack, RFC 6298 5.3) and nothing is sent twice. Timed from each packet's send alone,
// every packet queued more than 1 ms would time out.
TEST_F(ReliableTest, PacketsQueuedOnASlowLinkDoNotTimeOutWhileAcksFlow) {
  DatagramOptions ra, rb;
  ra.min_rto = ra.initial_rto = ra.max_rto = 1 * kMs;
  rb.ack_every = 4;  // an ack every 0.3 ms at this rate, well inside the 1 ms floor
  Make(ra, rb, 9000);
  pipe.bytes_per_us = 125;  // 1 Gbit/s
  const PeerHandle h = ConnectAB();
  const TimeNs t0 = pipe.now;
  TransferAndCheck(h, {4000000});
  EXPECT_GE(pipe.now - t0, 32 * kMs) << "the link rate did not apply";  // 4 MB at 125 B/us
  const DatagramStats rs = a->transport->DatagramStatsNow();
  EXPECT_EQ(rs.timeouts, 0u);
  EXPECT_EQ(rs.retransmits, 0u);
}

TEST_F(ReliableTest, WindowBoundsPacketsInFlight) {
  DatagramOptions r;
  r.window_packets = 8;
  Make(r, r);
  const PeerHandle h = ConnectAB();
  b->link.paused = true;
  FillRandom(a->buf, 1);
  ASSERT_TRUE(a->transport->PostSend_st(h, Spec(0, 100000, 0)).ok());
  for (int i = 0; i < 200; ++i) Step();
  // 8 fresh packets; anything more is a retransmission of those 8.
  const auto rs = a->transport->DatagramStatsNow();
  EXPECT_EQ(rs.data_packets_sent - rs.retransmits, 8u);
  b->link.paused = false;
  ASSERT_TRUE(RunUntil([&] { return a->handler.acked.size() == 1; }));
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 100000));
}

TEST_F(ReliableTest, ReceiverCreditLimitsALargerSenderWindow) {
  DatagramOptions big;
  DatagramOptions small;
  small.window_packets = 4;
  Make(big, small);
  const PeerHandle h = ConnectAB();
  b->link.paused = true;
  FillRandom(a->buf, 2);
  ASSERT_TRUE(a->transport->PostSend_st(h, Spec(0, 200000, 0)).ok());
  for (int i = 0; i < 100; ++i) Step();
  const auto rs = a->transport->DatagramStatsNow();
  EXPECT_EQ(rs.data_packets_sent - rs.retransmits, 4u);
  b->link.paused = false;
  ASSERT_TRUE(RunUntil([&] { return a->handler.acked.size() == 1; }));
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 200000));
  EXPECT_EQ(b->transport->DatagramStatsNow().beyond_credit, 0u);
}

// The receiver splits what its port can hold among the connections that send to it: a 16-packet
// budget offers 16 to one inbound connection, 8 each to two, 16 again once one has gone.
TEST_F(ReliableTest, ReceiveBudgetIsSplitAmongInboundConnections) {
  DatagramOptions ra, rb;
  rb.window_packets = 16;
  rb.rx_budget_packets = 16;
  Make(ra, rb);
  const PeerHandle h1 = ConnectAB();
  FillRandom(a->buf, 7);
  // Fresh packets a puts in flight on `h` while b reads nothing; then b catches up.
  auto fresh_in_flight = [&](PeerHandle h, uint64_t offset, uint64_t cookie) {
    const auto before = a->transport->DatagramStatsNow();
    b->link.paused = true;
    EXPECT_TRUE(a->transport->PostSend_st(h, Spec(offset, 100000, cookie)).ok());
    for (int i = 0; i < 200; ++i) Step();
    const auto after = a->transport->DatagramStatsNow();
    b->link.paused = false;
    const size_t acked = a->handler.acked.size();
    EXPECT_TRUE(RunUntil([&] { return a->handler.acked.size() == acked + 1; }));
    return (after.data_packets_sent - after.retransmits) -
           (before.data_packets_sent - before.retransmits);
  };
  EXPECT_EQ(fresh_in_flight(h1, 0, 1), 16u);
  auto h2 = a->transport->Connect_st(Job(0), "10.0.0.2:7610", pipe.now);
  ASSERT_TRUE(h2.ok()) << h2.status();
  ASSERT_TRUE(RunUntil([&] { return a->handler.up.size() == 2 && b->handler.up.size() == 2; }));
  // Granted credit is never taken back: h1 may still use what b offered it before, so move its
  // acknowledgement past that grant first.
  EXPECT_LE(fresh_in_flight(h1, 100000, 2), 16u);
  EXPECT_EQ(fresh_in_flight(h1, 200000, 3), 8u);
  EXPECT_EQ(fresh_in_flight(*h2, 300000, 4), 8u);
  a->transport->Disconnect_st(*h2, pipe.now);
  ASSERT_TRUE(RunUntil([&] { return b->handler.down.size() == 1; }));
  // The larger credit reaches a with b's next acknowledgement.
  EXPECT_EQ(fresh_in_flight(h1, 400000, 5), 8u);
  EXPECT_EQ(fresh_in_flight(h1, 500000, 6), 16u);
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 600000));
  EXPECT_EQ(b->transport->DatagramStatsNow().beyond_credit, 0u);
}

// Closes and rejects to addresses without a connection are rate limited: a flood of stray
// datagrams (or hellos) gets a burst of answers, then about 1000 a second, and is counted.
TEST_F(ReliableTest, AnswersToStrangersAreRateLimited) {
  Make();
  DgramHeader h{};
  h.magic = kDgramMagic;
  h.version = kDgramVersion;
  h.type = static_cast<uint8_t>(DgramType::kAck);
  h.dst_conn = 0x7777;  // no such connection at b
  h.src_conn = 5;
  std::vector<uint8_t> stray(sizeof(h));
  std::memcpy(stray.data(), &h, sizeof(h));
  auto flood = [&](int n) {
    const DatagramStats before = b->transport->DatagramStatsNow();
    const uint64_t sent = b->link.sent;
    for (int i = 0; i < n; ++i)
      pipe.Deliver(a->link.local_endpoint(), b->link.local_endpoint(), stray);
    Step(pipe.delay);
    const DatagramStats after = b->transport->DatagramStatsNow();
    EXPECT_EQ(after.stray - before.stray, static_cast<uint64_t>(n));
    return std::make_pair(b->link.sent - sent,
                          after.replies_suppressed - before.replies_suppressed);
  };
  const auto [answered, suppressed] = flood(1000);
  EXPECT_EQ(answered, 64u);  // the burst
  EXPECT_EQ(suppressed, 936u);
  pipe.now += 100 * kMs;  // refills 100 answers, capped at the burst
  const auto [answered2, suppressed2] = flood(100);
  EXPECT_EQ(answered2, 64u);
  EXPECT_EQ(suppressed2, 36u);
}

TEST_F(ReliableTest, FullLinkIsRetriedNotLost) {
  Make();
  const PeerHandle h = ConnectAB();
  FillRandom(a->buf, 5);
  ASSERT_TRUE(a->transport->PostSend_st(h, Spec(0, 300000, 0)).ok());
  for (int i = 0; i < 50; ++i) {
    a->link.tx_budget = 3;  // the NIC takes 3 datagrams per step
    Step();
  }
  a->link.tx_budget = -1;
  ASSERT_TRUE(RunUntil([&] { return a->handler.acked.size() == 1; }));
  EXPECT_GT(a->transport->DatagramStatsNow().link_full, 0u);
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 300000));
}

TEST_F(ReliableTest, VanishedPeerFailsPendingSendsInOrderThenGoesDown) {
  Make();
  const PeerHandle h = ConnectAB();
  b->link.vanished = true;
  for (uint64_t i = 0; i < 5; ++i)
    ASSERT_TRUE(a->transport->PostSend_st(h, Spec(i * 1000, 1000, i)).ok());
  const TimeNs t0 = pipe.now;
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }, sched::kSecond));
  EXPECT_GE(pipe.now - t0, Opts().peer_timeout);
  ASSERT_EQ(a->handler.failed.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(a->handler.failed[i].first.cookie, i);
  EXPECT_LE(a->handler.failed_at.back(), a->handler.down_at[0]);
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a->transport->Stats().peer_timeouts, 1u);
  EXPECT_FALSE(a->transport->PostSend_st(h, Spec(0, 1, 9)).ok());
}

TEST_F(ReliableTest, IdlePeerThatVanishesIsNoticedByKeepalive) {
  Make();
  ConnectAB();
  // Idle but alive: keepalives keep it up well past the timeout.
  for (int i = 0; i < 50000; ++i) Step();  // 500 ms
  EXPECT_TRUE(a->handler.down.empty());
  b->link.vanished = true;
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }, sched::kSecond));
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ReliableTest, DisconnectTellsThePeer) {
  Make();
  const PeerHandle h = ConnectAB();
  a->transport->Disconnect_st(h, pipe.now);
  ASSERT_EQ(a->handler.down.size(), 1u);
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(RunUntil([&] { return !b->handler.down.empty(); }, 10 * kMs));
  EXPECT_EQ(b->handler.down[0].second.code(), absl::StatusCode::kUnavailable)
      << b->handler.down[0].second;
}

TEST_F(ReliableTest, RejectedSegmentFailsOnlyThatSend) {
  Make();
  const PeerHandle h = ConnectAB();
  b->handler.resolve = [this](const PeerInfo&, const FrameHeader& hd) {
    return hd.key == 1 ? RecvTarget::Reject() : RecvTarget::Into(b->region, hd.offset, hd.key);
  };
  FillRandom(a->buf, 8);
  for (uint64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(a->transport->PostSend_st(h, Spec(i * 5000, 5000, i)).ok());
  ASSERT_TRUE(RunUntil([&] { return a->handler.acked.size() + a->handler.failed.size() == 3; }));
  ASSERT_EQ(a->handler.failed.size(), 1u);
  EXPECT_EQ(a->handler.failed[0].first.cookie, 1u);
  EXPECT_EQ(a->handler.failed[0].second.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(a->handler.acked.size(), 2u);
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 5000));
  EXPECT_EQ(0, std::memcmp(a->buf.data() + 10000, b->buf.data() + 10000, 5000));
  EXPECT_TRUE(a->handler.down.empty());
}

TEST_F(ReliableTest, BothDirectionsAtOnce) {
  Make();
  const PeerHandle h = ConnectAB();
  a->handler.resolve = [this](const PeerInfo&, const FrameHeader& hd) {
    return RecvTarget::Into(a->region, (2 << 20) + hd.offset, hd.key);
  };
  FillRandom(a->buf, 11);
  std::vector<uint8_t> bsrc(1 << 20);
  FillRandom(bsrc, 12);
  std::memcpy(b->buf.data() + (2 << 20), bsrc.data(), bsrc.size());
  ASSERT_TRUE(a->transport->PostSend_st(h, Spec(0, 1 << 20, 0)).ok());
  const PeerHandle back = b->handler.up[0].handle;
  SendSpec s;
  s.key = 7;
  s.offset = 0;
  s.length = 1 << 20;
  s.region = b->region;
  s.region_offset = 2 << 20;
  ASSERT_TRUE(b->transport->PostSend_st(back, s).ok());
  ASSERT_TRUE(
      RunUntil([&] { return a->handler.acked.size() == 1 && b->handler.acked.size() == 1; }));
  EXPECT_EQ(0, std::memcmp(a->buf.data(), b->buf.data(), 1 << 20));
  EXPECT_EQ(0, std::memcmp(a->buf.data() + (2 << 20), bsrc.data(), 1 << 20));
}

TEST_F(ReliableTest, LostHelloOkWhileTheAcceptorAlreadySends) {
  Make();
  b->link.drop_type = static_cast<int>(DgramType::kHelloOk);
  // The acceptor sends to the dialer as soon as it is up, before the dialer knows it is.
  b->handler.resolve = [this](const PeerInfo&, const FrameHeader& h) {
    return RecvTarget::Into(b->region, h.offset, h.key);
  };
  a->handler.resolve = [this](const PeerInfo&, const FrameHeader& h) {
    return RecvTarget::Into(a->region, (2 << 20) + h.offset, h.key);
  };
  FillRandom(b->buf, 21);
  ASSERT_TRUE(a->transport->Connect_st(Job(0), "10.0.0.2:7610", pipe.now).ok());
  ASSERT_TRUE(RunUntil([&] { return !b->handler.up.empty(); }));
  SendSpec s;
  s.key = 3;
  s.length = 50000;
  s.region = b->region;
  ASSERT_TRUE(b->transport->PostSend_st(b->handler.up[0].handle, s).ok());
  ASSERT_TRUE(RunUntil([&] { return b->handler.acked.size() == 1 || !b->handler.down.empty(); }));
  EXPECT_TRUE(b->handler.down.empty());
  EXPECT_TRUE(a->handler.down.empty());
  ASSERT_EQ(a->handler.up.size(), 1u);
  EXPECT_EQ(0, std::memcmp(a->buf.data() + (2 << 20), b->buf.data(), 50000));
}

TEST_F(ReliableTest, CloseCarriesTheFinalAcknowledgements) {
  Make();
  const PeerHandle h = ConnectAB();
  b->link.drop_type_always = static_cast<int>(DgramType::kAck);  // every pure ack is lost
  FillRandom(a->buf, 31);
  ASSERT_TRUE(a->transport->PostSend_st(h, Spec(0, 3000, 0)).ok());
  ASSERT_TRUE(RunUntil([&] { return b->handler.received.size() == 1; }));
  for (int i = 0; i < 10; ++i) Step();
  EXPECT_TRUE(a->handler.acked.empty());
  // b leaves (its client is done): its close says the segment was placed.
  b->transport->Disconnect_st(b->handler.up[0].handle, pipe.now);
  ASSERT_TRUE(RunUntil([&] { return !a->handler.down.empty(); }, 10 * kMs));
  ASSERT_EQ(a->handler.acked.size(), 1u);
  EXPECT_TRUE(a->handler.failed.empty());
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kUnavailable);
}

TEST_F(ReliableTest, MalformedDatagramsAreCountedAndIgnored) {
  Make();
  const PeerHandle h = ConnectAB();
  std::vector<uint8_t> junk(300, 0xAB);
  b->transport->OnDatagram_st(Ipv4Endpoint{0x0A000001, 7610}, junk, pipe.now);
  b->transport->OnDatagram_st(Ipv4Endpoint{0x0A000001, 7610},
                              std::span<const uint8_t>(junk.data(), 5), pipe.now);
  DgramHeader d{};
  d.magic = kDgramMagic;
  d.version = kDgramVersion;
  d.type = static_cast<uint8_t>(DgramType::kData);
  d.payload_bytes = 9999;  // lies about its length
  b->transport->OnDatagram_st(Ipv4Endpoint{0x0A000001, 7610},
                              std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&d), sizeof(d)),
                              pipe.now);
  const auto st = b->transport->Stats();
  EXPECT_EQ(st.errors[static_cast<size_t>(WireError::kBadMagic)], 1u);
  EXPECT_EQ(st.errors[static_cast<size_t>(WireError::kBadLength)], 2u);
  TransferAndCheck(h, {5000});
}

TEST_F(ReliableTest, AckBeyondWhatWasSentClosesTheConnection) {
  Make();
  ConnectAB();
  // b claims to have received packets a never sent.
  DgramHeader d{};
  d.magic = kDgramMagic;
  d.version = kDgramVersion;
  d.type = static_cast<uint8_t>(DgramType::kAck);
  d.dst_conn = a->handler.up[0].handle;
  d.src_conn = b->handler.up[0].handle;
  d.ack = 1000;
  a->transport->OnDatagram_st(Ipv4Endpoint{0x0A000002, 7610},
                              std::span<const uint8_t>(reinterpret_cast<uint8_t*>(&d), sizeof(d)),
                              pipe.now);
  ASSERT_EQ(a->handler.down.size(), 1u);
  EXPECT_EQ(a->handler.down[0].second.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(RunUntil([&] { return !b->handler.down.empty(); }, 10 * kMs));
}

TEST_F(ReliableTest, BadOptionsAreRefused) {
  PipeLink link(&pipe, Ipv4Endpoint{1, 1}, 1500);
  RecordingHandler hd;
  DatagramOptions r;
  r.window_packets = kMaxWindow + 1;
  EXPECT_FALSE(DatagramTransport::Create(Opts(), r, &link, &hd).ok());
  r = {};
  r.faults.drop_probability = 1.5;
  EXPECT_FALSE(DatagramTransport::Create(Opts(), r, &link, &hd).ok());
  PipeLink tiny(&pipe, Ipv4Endpoint{1, 2}, 200);
  EXPECT_FALSE(DatagramTransport::Create(Opts(), {}, &tiny, &hd).ok());
}

}  // namespace
}  // namespace gradlane::transport::datagram
