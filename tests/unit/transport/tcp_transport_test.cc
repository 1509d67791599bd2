// The TCP backend over 127.0.0.1: two transports in one process, driven alternately from the
// test thread; raw sockets play misbehaving peers. Every wait is bounded by a deadline.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/transport/recording_handler.h"

namespace gradlane::transport {
namespace {

using tcp::TcpTransport;
using testing::MonotonicNow;
using testing::RecordingHandler;

constexpr uint64_t kJob = 42;
constexpr char kToken[] = "job-42-shared-secret";

JobCredentials Job(uint16_t rank, std::string token = kToken, uint64_t job = kJob) {
  return JobCredentials{job, rank, 2, std::move(token)};
}

TransportOptions Opts() {
  TransportOptions o;
  o.listen_address = "127.0.0.1";
  o.listen_port = 0;
  o.peer_timeout = 2 * sched::kSecond;
  o.connect_initial_backoff = 10 * sched::kMillisecond;
  o.connect_max_backoff = 50 * sched::kMillisecond;
  o.connect_deadline = 5 * sched::kSecond;
  o.connect_attempt_timeout = 1 * sched::kSecond;
  o.max_connections = 16;
  o.max_pending_sends_per_peer = 1024;
  o.max_segment_bytes = 16 << 20;
  return o;
}

struct Node {
  explicit Node(const TransportOptions& o = Opts()) {
    auto r = TcpTransport::Create(o, &h);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) t = std::move(*r);
  }
  RecordingHandler h;
  std::unique_ptr<TcpTransport> t;
};

// Drives the transports until `done` holds or `timeout` passes; returns done().
// The timeout only ends a test that is failing anyway; a busy machine must never reach it.
bool PumpUntil(std::initializer_list<TcpTransport*> ts, const std::function<bool()>& done,
               TimeNs timeout = 30 * sched::kSecond) {
  const TimeNs deadline = MonotonicNow() + timeout;
  while (!done()) {
    if (MonotonicNow() > deadline) return false;
    for (TcpTransport* t : ts) t->Progress_st(MonotonicNow(), 1);
  }
  return true;
}

void PumpFor(std::initializer_list<TcpTransport*> ts, TimeNs duration) {
  PumpUntil(
      ts, [] { return false; }, duration);
}

std::string Addr(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

// A port nobody listens on right now.
uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// b listens as rank 1, a dials it as rank 0; returns a's handle (b's is b.h.up[0].handle).
PeerHandle ConnectPair(Node& a, Node& b, uint16_t* port_out = nullptr) {
  auto port = b.t->Listen_st();
  EXPECT_TRUE(port.ok()) << port.status();
  EXPECT_TRUE(a.t->AddJob_st(Job(0)).ok());
  EXPECT_TRUE(b.t->AddJob_st(Job(1)).ok());
  auto h = a.t->Connect_st(Job(0), Addr(*port), MonotonicNow());
  EXPECT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(
      PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.up.size() == 1 && b.h.up.size() == 1; }));
  if (port_out != nullptr) *port_out = *port;
  return h.ok() ? *h : kNoPeer;
}

// One direction of a transfer: segments laid end to end in `src`, landing at the same offsets
// in `dst` (chosen by the receiver's resolver from the key).
struct Transfer {
  std::vector<uint64_t> sizes, offsets;
  std::vector<uint8_t> src, dst;
  RegionId src_region = kNoRegion, dst_region = kNoRegion;

  explicit Transfer(std::vector<uint64_t> s, uint32_t seed) : sizes(std::move(s)) {
    uint64_t total = 0;
    for (uint64_t n : sizes) {
      offsets.push_back(total);
      total += n;
    }
    src.resize(total);
    dst.assign(total, 0);
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i + 8 <= total; i += 8) {
      const uint64_t v = rng();
      std::memcpy(&src[i], &v, 8);
    }
    for (size_t i = total & ~size_t{7}; i < total; ++i) src[i] = static_cast<uint8_t>(rng());
  }
  uint64_t total() const { return src.size(); }
  SendSpec Spec(size_t i) const {
    SendSpec s;
    s.key = sched::MakeKey(7, static_cast<uint32_t>(i));
    s.iteration = 3;
    s.offset = offsets[i];
    s.length = sizes[i];
    s.priority = static_cast<sched::Priority>(i % 5);
    s.dtype = sched::DType::kF16;
    s.direction = sched::Direction::kPush;
    s.region = src_region;
    s.region_offset = offsets[i];
    s.cookie = 1000 + i;
    return s;
  }
  RecvTarget Resolve(const FrameHeader& h) const {
    const uint32_t i = sched::KeyPartition(h.key);
    if (sched::KeyTensor(h.key) != 7 || i >= sizes.size()) return RecvTarget::Reject();
    return RecvTarget::Into(dst_region, offsets[i], i);
  }
};

void ExpectDelivered(const Transfer& x, const RecordingHandler& sender,
                     const RecordingHandler& receiver) {
  ASSERT_EQ(receiver.received.size(), x.sizes.size());
  for (size_t i = 0; i < x.sizes.size(); ++i) {
    const FrameHeader& h = receiver.received[i].header;
    ASSERT_EQ(sched::KeyPartition(h.key), i) << "delivery out of order";
    EXPECT_EQ(h.length, x.sizes[i]);
    EXPECT_EQ(h.offset, x.offsets[i]);
    EXPECT_EQ(h.iteration, 3);
    EXPECT_EQ(h.priority, static_cast<int32_t>(i % 5));
    EXPECT_EQ(h.dtype, static_cast<uint8_t>(sched::DType::kF16));
    EXPECT_EQ(receiver.received[i].target.cookie, i);
  }
  EXPECT_TRUE(x.src == x.dst) << "payload bytes differ";
  ASSERT_EQ(sender.done.size(), x.sizes.size());
  ASSERT_EQ(sender.acked.size(), x.sizes.size());
  for (size_t i = 0; i < x.sizes.size(); ++i) {
    EXPECT_EQ(sender.done[i].cookie, 1000 + i);
    EXPECT_EQ(sender.acked[i].cookie, 1000 + i) << "acks out of order";
    EXPECT_EQ(sender.acked[i].length, x.sizes[i]);
  }
  EXPECT_TRUE(sender.failed.empty());
}

TEST(TcpTransport, AwkwardSizesArriveBitExactInOrderBothWays) {
  TransportOptions o = Opts();
  o.socket_buffer_bytes = 64 << 10;  // small buffers force partial writes and reads
  Node a(o), b(o);
  const PeerHandle ab = ConnectPair(a, b);
  ASSERT_NE(ab, kNoPeer);
  const PeerHandle ba = b.h.up[0].handle;
  EXPECT_TRUE(b.h.up[0].inbound);
  EXPECT_EQ(b.h.up[0].rank, 0);
  EXPECT_EQ(a.h.up[0].rank, 1);
  EXPECT_FALSE(a.h.up[0].inbound);

  std::vector<uint64_t> sizes = {1,
                                 2,
                                 7,
                                 0,
                                 63,
                                 64,
                                 65,
                                 1000,
                                 4095,
                                 4096,
                                 4097,
                                 65535,
                                 65536,
                                 65537,
                                 1 << 20,
                                 (3 << 20) + 5,
                                 (8 << 20) + 3,
                                 1};
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) sizes.push_back(1 + rng() % 3000);
  Transfer fwd(sizes, 11);
  Transfer rev({5, 1, 100000, 3, (2 << 20) + 1, 64, 9}, 22);

  fwd.src_region = *a.t->RegisterRegion_st(fwd.src.data(), fwd.src.size());
  fwd.dst_region = *b.t->RegisterRegion_st(fwd.dst.data(), fwd.dst.size());
  rev.src_region = *b.t->RegisterRegion_st(rev.src.data(), rev.src.size());
  rev.dst_region = *a.t->RegisterRegion_st(rev.dst.data(), rev.dst.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader& h) { return fwd.Resolve(h); };
  a.h.resolve = [&](const PeerInfo&, const FrameHeader& h) { return rev.Resolve(h); };

  for (size_t i = 0; i < fwd.sizes.size(); ++i) ASSERT_TRUE(a.t->PostSend_st(ab, fwd.Spec(i)).ok());
  for (size_t i = 0; i < rev.sizes.size(); ++i) ASSERT_TRUE(b.t->PostSend_st(ba, rev.Spec(i)).ok());

  ASSERT_TRUE(PumpUntil(
      {a.t.get(), b.t.get()},
      [&] { return a.h.acked.size() == fwd.sizes.size() && b.h.acked.size() == rev.sizes.size(); },
      15 * sched::kSecond));
  ExpectDelivered(fwd, a.h, b.h);
  ExpectDelivered(rev, b.h, a.h);

  // Live stats by direction and peer.
  const PeerStats as = a.t->PeerStatsOf(ab);
  const PeerStats bs = b.t->PeerStatsOf(ba);
  EXPECT_EQ(as.bytes_sent, fwd.total());
  EXPECT_EQ(as.bytes_received, rev.total());
  EXPECT_EQ(as.frames_sent, fwd.sizes.size());
  EXPECT_EQ(as.acks_received, fwd.sizes.size());
  EXPECT_EQ(as.acks_sent, rev.sizes.size());
  EXPECT_EQ(bs.bytes_received, fwd.total());
  EXPECT_EQ(bs.bytes_sent, rev.total());
  EXPECT_EQ(bs.frames_received, fwd.sizes.size());
  EXPECT_EQ(a.t->Stats().total.bytes_sent, fwd.total());
  EXPECT_EQ(b.t->Stats().malformed(), 0u);
  EXPECT_EQ(a.t->Stats().malformed(), 0u);
}

TEST(TcpTransport, ResolverRejectFailsThatSendOnly) {
  Node a, b;
  const PeerHandle ab = ConnectPair(a, b);
  Transfer x({100, 200, 300}, 5);
  x.src_region = *a.t->RegisterRegion_st(x.src.data(), x.src.size());
  x.dst_region = *b.t->RegisterRegion_st(x.dst.data(), x.dst.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader& h) {
    return sched::KeyPartition(h.key) == 1 ? RecvTarget::Reject() : x.Resolve(h);
  };
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(a.t->PostSend_st(ab, x.Spec(i)).ok());
  ASSERT_TRUE(
      PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.acked.size() + a.h.failed.size() == 3; }));
  ASSERT_EQ(a.h.acked.size(), 2u);
  EXPECT_EQ(a.h.acked[0].cookie, 1000u);
  EXPECT_EQ(a.h.acked[1].cookie, 1002u);
  ASSERT_EQ(a.h.failed.size(), 1u);
  EXPECT_EQ(a.h.failed[0].first.cookie, 1001u);
  EXPECT_EQ(a.h.failed[0].second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.h.received.size(), 2u);
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kNoTarget)], 1u);
  // The rejected payload was discarded, not written anywhere.
  EXPECT_EQ(std::count(x.dst.begin() + 100, x.dst.begin() + 300, 0), 200);
  EXPECT_TRUE(a.h.down.empty());
  EXPECT_TRUE(b.h.down.empty());
  // A resolver target outside its region is refused the same way, not written out of bounds.
  b.h.resolve = [&](const PeerInfo&, const FrameHeader&) {
    return RecvTarget::Into(x.dst_region, x.total() - 10);
  };
  ASSERT_TRUE(a.t->PostSend_st(ab, x.Spec(2)).ok());
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.failed.size() == 2; }));
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kNoTarget)], 2u);
}

TEST(TcpTransport, WrongAuthTokenIsRejected) {
  Node a, b;
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  ASSERT_TRUE(a.t->AddJob_st(Job(0, "not-the-secret")).ok());
  ASSERT_TRUE(a.t->Connect_st(Job(0, "not-the-secret"), Addr(port), MonotonicNow()).ok());
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return !a.h.down.empty(); }));
  EXPECT_EQ(a.h.down[0].second.code(), absl::StatusCode::kPermissionDenied) << a.h.down[0].second;
  EXPECT_NE(a.h.down[0].second.message().find("auth_failed"), absl::string_view::npos);
  EXPECT_TRUE(a.h.up.empty());
  EXPECT_TRUE(b.h.up.empty());
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kAuthFailed)], 1u);
  EXPECT_EQ(a.t->Stats().connect_attempts, 1u) << "a refusal must not be retried";
}

TEST(TcpTransport, UnknownJobAndBadRankAreRejected) {
  Node a, b;
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  ASSERT_TRUE(a.t->AddJob_st(Job(0, kToken, 99)).ok());
  ASSERT_TRUE(a.t->AddJob_st(JobCredentials{kJob, 1, 2, kToken}).ok());  // same rank as b
  ASSERT_TRUE(a.t->Connect_st(Job(0, kToken, 99), Addr(port), MonotonicNow()).ok());
  ASSERT_TRUE(a.t->Connect_st(JobCredentials{kJob, 1, 2, kToken}, Addr(port), MonotonicNow()).ok());
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.down.size() == 2; }));
  std::vector<absl::StatusCode> codes = {a.h.down[0].second.code(), a.h.down[1].second.code()};
  std::sort(codes.begin(), codes.end());
  EXPECT_EQ(codes[0], absl::StatusCode::kInvalidArgument);  // bad rank
  EXPECT_EQ(codes[1], absl::StatusCode::kNotFound);         // unknown job
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kUnknownJob)], 1u);
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kBadRank)], 1u);
  EXPECT_TRUE(b.h.up.empty());
}

// A peer played by hand through a blocking loopback socket; reads pump the transport.
class RawPeer {
 public:
  explicit RawPeer(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;  // the frames go out in pieces: don't let Nagle + delayed ack stall them
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~RawPeer() { close(fd_); }
  bool connected() const { return connected_; }
  void Send(const void* p, size_t n) {
    ASSERT_EQ(send(fd_, p, n, MSG_NOSIGNAL), static_cast<ssize_t>(n));
  }
  void SendHello(uint8_t version, std::string token = kToken) {
    FrameHeader h = MakeHeader(FrameType::kHello, kJob, 0);
    h.version = version;
    h.payload_bytes = kHelloBodyBytes;
    HelloBody b;
    std::memset(&b, 0, sizeof(b));
    b.rank = 0;
    b.world_size = 2;
    b.token_bytes = static_cast<uint16_t>(token.size());
    std::memcpy(b.token, token.data(), token.size());
    Send(&h, sizeof(h));
    Send(&b, sizeof(b));
  }
  // Reads exactly n bytes, pumping `t` meanwhile; false on EOF, error or timeout.
  bool Read(void* p, size_t n, TcpTransport* t) {
    size_t got = 0;
    const TimeNs deadline = MonotonicNow() + 5 * sched::kSecond;
    while (got < n && MonotonicNow() < deadline) {
      const ssize_t r = recv(fd_, static_cast<uint8_t*>(p) + got, n - got, MSG_DONTWAIT);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        return false;
      } else {
        t->Progress_st(MonotonicNow(), 1);
      }
    }
    return got == n;
  }
  // Reads a frame header and its error body; returns the code (or -1).
  int ReadErrorFrame(FrameType want, TcpTransport* t, std::string* reason = nullptr) {
    FrameHeader h;
    if (!Read(&h, sizeof(h), t)) return -1;
    if (CheckHeader(h, 0) != WireError::kNone || TypeOf(h) != want) return -2;
    std::vector<uint8_t> body(h.payload_bytes);
    if (!Read(body.data(), body.size(), t)) return -1;
    ErrorBody eb;
    std::memcpy(&eb, body.data(), sizeof(eb));
    if (reason != nullptr)
      reason->assign(reinterpret_cast<char*>(body.data()) + 8, eb.reason_bytes);
    return static_cast<int>(eb.code);
  }
  // True once the transport closed its side (EOF or reset), pumping `t` meanwhile.
  bool ClosedByPeer(TcpTransport* t) {
    uint8_t x[256];
    const TimeNs deadline = MonotonicNow() + 5 * sched::kSecond;
    while (MonotonicNow() < deadline) {
      const ssize_t r = recv(fd_, x, sizeof(x), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
      t->Progress_st(MonotonicNow(), 1);
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST(TcpTransport, WrongProtocolVersionIsRejectedWithAReadableReason) {
  Node b;
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  RawPeer raw(port);
  ASSERT_TRUE(raw.connected());
  raw.SendHello(/*version=*/1);  // a daemon of the previous protocol
  std::string reason;
  EXPECT_EQ(raw.ReadErrorFrame(FrameType::kReject, b.t.get(), &reason),
            static_cast<int>(WireError::kBadVersion));
  EXPECT_NE(reason.find("version 1"), std::string::npos) << reason;
  EXPECT_TRUE(raw.ClosedByPeer(b.t.get()));
  EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(WireError::kBadVersion)], 1u);
  EXPECT_TRUE(b.h.up.empty());
}

TEST(TcpTransport, MalformedFramesAreCountedAndTheTransportLivesOn) {
  TransportOptions o = Opts();
  o.max_segment_bytes = 1 << 20;
  Node b(o);
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  std::vector<uint8_t> sink(4096);
  const RegionId r = *b.t->RegisterRegion_st(sink.data(), sink.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader&) { return RecvTarget::Into(r, 0); };

  // Before the handshake: garbage where the hello should be.
  {
    RawPeer raw(port);
    ASSERT_TRUE(raw.connected());
    const char junk[64] = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
    raw.Send(junk, sizeof(junk));
    EXPECT_EQ(raw.ReadErrorFrame(FrameType::kReject, b.t.get()),
              static_cast<int>(WireError::kBadMagic));
    EXPECT_TRUE(raw.ClosedByPeer(b.t.get()));
  }
  // After a valid handshake: one malformed data header of each class.
  struct Case {
    void (*mutate)(FrameHeader&);
    WireError want;
  };
  const Case cases[] = {
      {[](FrameHeader& h) { h.magic ^= 1; }, WireError::kBadMagic},
      {[](FrameHeader& h) { h.version = kProtocolVersion + 1; }, WireError::kBadVersion},
      {[](FrameHeader& h) { h.type = 200; }, WireError::kBadType},
      {[](FrameHeader& h) { h.flags = 0x40; }, WireError::kUnknownFlags},
      {[](FrameHeader& h) { h.length = h.payload_bytes = 2 << 20; }, WireError::kTooLong},
      {[](FrameHeader& h) { h.payload_bytes = 5; }, WireError::kBadLength},
      {[](FrameHeader& h) { h.dtype = 9; }, WireError::kBadField},
      {[](FrameHeader& h) {
         h.type = static_cast<uint8_t>(FrameType::kHello);
         h.payload_bytes = kHelloBodyBytes;
       },
       WireError::kUnexpectedFrame},
      {[](FrameHeader& h) { h.job_id = 7; }, WireError::kUnknownJob},
  };
  size_t i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(WireErrorName(c.want)));
    RawPeer raw(port);
    ASSERT_TRUE(raw.connected());
    raw.SendHello(kProtocolVersion);
    FrameHeader ok;
    ASSERT_TRUE(raw.Read(&ok, sizeof(ok), b.t.get()));
    ASSERT_EQ(TypeOf(ok), FrameType::kHelloOk);
    FrameHeader h = MakeHeader(FrameType::kData, kJob, 0);
    h.length = h.payload_bytes = 16;
    c.mutate(h);
    raw.Send(&h, sizeof(h));
    EXPECT_EQ(raw.ReadErrorFrame(FrameType::kGoodbye, b.t.get()), static_cast<int>(c.want));
    EXPECT_TRUE(raw.ClosedByPeer(b.t.get()));
    ++i;
    ASSERT_EQ(b.h.down.size(), i);  // the inbound peer came up, then went down with the error
    EXPECT_EQ(b.t->Stats().errors[static_cast<size_t>(c.want)],
              c.want == WireError::kBadMagic ? 2u : 1u);
  }
  EXPECT_EQ(b.t->Stats().malformed(), 8u);  // 7 header classes + the pre-handshake garbage
  EXPECT_TRUE(b.h.received.empty());

  // The transport carries on: a well-behaved peer still gets through.
  Node a;
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  const PeerHandle ab = *a.t->Connect_st(Job(0), Addr(port), MonotonicNow());
  std::vector<uint8_t> src(100, 0x5A);
  SendSpec s;
  s.region = *a.t->RegisterRegion_st(src.data(), src.size());
  s.length = src.size();
  ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.acked.size() == 1; }));
  EXPECT_EQ(sink[99], 0x5A);
}

// Every single-bit corruption of a data header gets an answer — an ack if the frame is still
// valid, otherwise a goodbye naming the error and a close — never a crash, hang or silence.
// (One flip turns kData into a well-formed kGoodbye: that one is honoured with a close.)
TEST(TcpTransport, EverySingleBitFlipOfAHeaderIsAnsweredAndCounted) {
  TransportOptions o = Opts();
  o.max_segment_bytes = 1 << 20;
  Node b(o);
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  std::vector<uint8_t> sink(1 << 16);
  const RegionId r = *b.t->RegisterRegion_st(sink.data(), sink.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader& h) {
    return h.length <= 64 ? RecvTarget::Into(r, 0) : RecvTarget::Reject();
  };
  const uint8_t payload[16] = {1, 2, 3};
  int acks = 0, goodbyes = 0, honoured = 0;
  for (size_t bit = 0; bit < kFrameHeaderBytes * 8; ++bit) {
    SCOPED_TRACE(bit);
    RawPeer raw(port);
    ASSERT_TRUE(raw.connected());
    raw.SendHello(kProtocolVersion);
    FrameHeader ok;
    ASSERT_TRUE(raw.Read(&ok, sizeof(ok), b.t.get()));
    FrameHeader h = MakeHeader(FrameType::kData, kJob, 0);
    h.length = h.payload_bytes = sizeof(payload);
    reinterpret_cast<uint8_t*>(&h)[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    raw.Send(&h, sizeof(h));
    raw.Send(payload, sizeof(payload));
    FrameHeader reply;
    if (!raw.Read(&reply, sizeof(reply), b.t.get())) {
      EXPECT_EQ(TypeOf(h), FrameType::kGoodbye) << "no answer to a corrupt frame";
      EXPECT_TRUE(raw.ClosedByPeer(b.t.get()));
      ++honoured;
    } else if (TypeOf(reply) == FrameType::kAck) {
      ++acks;
      EXPECT_EQ(reply.seq, h.seq);
      EXPECT_EQ(reply.key, h.key);
    } else {
      ASSERT_EQ(TypeOf(reply), FrameType::kGoodbye);
      ++goodbyes;
      std::vector<uint8_t> body(reply.payload_bytes);
      ASSERT_TRUE(raw.Read(body.data(), body.size(), b.t.get()));
      EXPECT_TRUE(raw.ClosedByPeer(b.t.get()));
    }
  }
  uint64_t counted = 0;
  for (const uint64_t n : b.t->Stats().errors) counted += n;
  EXPECT_EQ(counted - b.t->Stats().errors[static_cast<size_t>(WireError::kNoTarget)],
            static_cast<uint64_t>(goodbyes));
  EXPECT_GT(acks, 100);      // key, iteration, offset, priority, rank, seq bits: still valid
  EXPECT_GT(goodbyes, 100);  // magic, version, type, flags, lengths, dtype, job bits: not
  EXPECT_EQ(honoured, 1);
  EXPECT_EQ(acks + goodbyes + honoured, static_cast<int>(kFrameHeaderBytes * 8));
}

TEST(TcpTransport, KilledPeerFailsPendingSendsPromptly) {
  TransportOptions o = Opts();
  o.peer_timeout = 1 * sched::kSecond;
  auto a = std::make_unique<Node>(o);
  auto b = std::make_unique<Node>(o);
  const PeerHandle ab = ConnectPair(*a, *b);
  std::vector<uint8_t> src(1 << 20, 1);
  const RegionId r = *a->t->RegisterRegion_st(src.data(), src.size());
  constexpr int kSends = 32;
  for (int i = 0; i < kSends; ++i) {
    SendSpec s;
    s.region = r;
    s.length = src.size();
    s.key = static_cast<sched::SegmentKey>(i);
    s.cookie = static_cast<uint64_t>(i);
    ASSERT_TRUE(a->t->PostSend_st(ab, s).ok());
  }
  PumpFor({a->t.get()}, 50 * sched::kMillisecond);  // b never reads: the sends stay pending
  ASSERT_TRUE(a->h.acked.empty());
  const TimeNs killed = MonotonicNow();
  b.reset();  // closes with unread data: the kernel resets the connection
  ASSERT_TRUE(PumpUntil(
      {a->t.get()}, [&] { return !a->h.down.empty(); }, 3 * sched::kSecond));
  EXPECT_LT(a->h.down_at[0] - killed, o.peer_timeout);
  EXPECT_EQ(a->h.down[0].second.code(), absl::StatusCode::kUnavailable) << a->h.down[0].second;
  ASSERT_EQ(a->h.failed.size(), static_cast<size_t>(kSends));
  for (int i = 0; i < kSends; ++i) EXPECT_EQ(a->h.failed[i].first.cookie, static_cast<uint64_t>(i));
  EXPECT_LE(a->h.failed_at.back(), a->h.down_at[0]) << "sends fail before the peer-down report";
  EXPECT_EQ(a->t->Stats().peer_resets, 1u);
  EXPECT_EQ(a->t->PostSend_st(ab, SendSpec{}).code(), absl::StatusCode::kNotFound);
}

TEST(TcpTransport, SilentPeerTimesOutWithinTheConfiguredBound) {
  TransportOptions o = Opts();
  o.peer_timeout = 300 * sched::kMillisecond;
  Node a(o), b(o);
  const PeerHandle ab = ConnectPair(a, b);
  std::vector<uint8_t> src(1 << 20, 1);
  const RegionId r = *a.t->RegisterRegion_st(src.data(), src.size());
  for (int i = 0; i < 2; ++i) {
    SendSpec s;
    s.region = r;
    s.length = src.size();
    s.cookie = static_cast<uint64_t>(i);
    ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  }
  const TimeNs posted = MonotonicNow();
  // b stays alive (its kernel even accepts bytes) but its engine never runs: no acks come.
  ASSERT_TRUE(PumpUntil(
      {a.t.get()}, [&] { return !a.h.down.empty(); }, 3 * sched::kSecond));
  const TimeNs took = a.h.down_at[0] - posted;
  EXPECT_GE(took, o.peer_timeout);
  EXPECT_LT(took, o.peer_timeout + 1 * sched::kSecond);
  EXPECT_EQ(a.h.down[0].second.code(), absl::StatusCode::kDeadlineExceeded) << a.h.down[0].second;
  EXPECT_EQ(a.h.failed.size(), 2u);
  EXPECT_EQ(a.t->Stats().peer_timeouts, 1u);
  EXPECT_TRUE(b.h.down.empty());
}

TEST(TcpTransport, IdlePeerIsNotTimedOut) {
  TransportOptions o = Opts();
  o.peer_timeout = 150 * sched::kMillisecond;
  Node a(o), b(o);
  const PeerHandle ab = ConnectPair(a, b);
  PumpFor({a.t.get(), b.t.get()}, 400 * sched::kMillisecond);  // nothing pending: no timer
  EXPECT_TRUE(a.h.down.empty());
  // A send posted after the idle spell is measured from its post, not from the last traffic.
  std::vector<uint8_t> src(10), dst(10);
  SendSpec s;
  s.region = *a.t->RegisterRegion_st(src.data(), src.size());
  s.length = 10;
  const RegionId d = *b.t->RegisterRegion_st(dst.data(), dst.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader&) { return RecvTarget::Into(d, 0); };
  ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.acked.size() == 1; }));
  EXPECT_TRUE(a.h.down.empty());
}

TEST(TcpTransport, ConnectRetriesUntilTheListenerAppears) {
  const uint16_t port = FreePort();
  Node a;
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  const PeerHandle ab = *a.t->Connect_st(Job(0), Addr(port), MonotonicNow());
  // Posted while still dialing: goes out once the handshake completes.
  std::vector<uint8_t> src(3000, 0xC3), dst(3000);
  SendSpec s;
  s.region = *a.t->RegisterRegion_st(src.data(), src.size());
  s.length = src.size();
  ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  PumpFor({a.t.get()}, 150 * sched::kMillisecond);
  EXPECT_TRUE(a.h.up.empty());
  EXPECT_TRUE(a.h.down.empty());
  EXPECT_GE(a.t->Stats().connect_attempts, 2u);

  TransportOptions o = Opts();
  o.listen_port = port;
  Node b(o);
  ASSERT_TRUE(b.t->Listen_st().ok());
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  const RegionId d = *b.t->RegisterRegion_st(dst.data(), dst.size());
  b.h.resolve = [&](const PeerInfo&, const FrameHeader&) { return RecvTarget::Into(d, 0); };
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.acked.size() == 1; }));
  EXPECT_EQ(a.h.up.size(), 1u);
  EXPECT_GE(a.t->Stats().connect_retries, 1u);
  EXPECT_TRUE(src == dst);
}

TEST(TcpTransport, ConnectGivesUpAtTheDeadline) {
  TransportOptions o = Opts();
  o.connect_deadline = 300 * sched::kMillisecond;
  Node a(o);
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  const TimeNs start = MonotonicNow();
  const PeerHandle ab = *a.t->Connect_st(Job(0), Addr(FreePort()), start);
  std::vector<uint8_t> src(8);
  SendSpec s;
  s.region = *a.t->RegisterRegion_st(src.data(), src.size());
  s.length = 8;
  ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  ASSERT_TRUE(PumpUntil(
      {a.t.get()}, [&] { return !a.h.down.empty(); }, 3 * sched::kSecond));
  EXPECT_EQ(a.h.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(a.h.down[0].second.message().find("could not connect"), absl::string_view::npos);
  EXPECT_GE(a.h.down_at[0] - start, o.connect_deadline);
  EXPECT_LT(a.h.down_at[0] - start, o.connect_deadline + 1 * sched::kSecond);
  EXPECT_EQ(a.h.failed.size(), 1u);
}

TEST(TcpTransport, BusyPortIsAClearError) {
  Node b;
  const uint16_t port = *b.t->Listen_st();
  TransportOptions o = Opts();
  o.listen_port = port;
  Node c(o);
  const absl::StatusOr<uint16_t> r = c.t->Listen_st();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("already in use"), absl::string_view::npos) << r.status();
  o.listen_address = "not-an-address";
  Node d(o);
  EXPECT_EQ(d.t->Listen_st().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TcpTransport, PostSendChecksItsArguments) {
  TransportOptions o = Opts();
  o.max_pending_sends_per_peer = 4;
  Node a(o);
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  const PeerHandle h = *a.t->Connect_st(Job(0), Addr(FreePort()), MonotonicNow());
  std::vector<uint8_t> buf(100);
  const RegionId r = *a.t->RegisterRegion_st(buf.data(), buf.size());
  SendSpec s;
  s.region = r;
  s.length = 100;
  EXPECT_EQ(a.t->PostSend_st(kNoPeer, s).code(), absl::StatusCode::kNotFound);
  SendSpec bad = s;
  bad.region_offset = 1;  // one byte past the end
  EXPECT_EQ(a.t->PostSend_st(h, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.region = r + 1;
  EXPECT_EQ(a.t->PostSend_st(h, bad).code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(a.t->PostSend_st(h, s).ok());
  EXPECT_EQ(a.t->PostSend_st(h, s).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.t->Connect_st(Job(0, kToken, 5), "127.0.0.1:1", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // job not added
  EXPECT_EQ(a.t->Connect_st(Job(0), "127.0.0.1", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.t->AddJob_st(Job(0, std::string(kMaxTokenBytes + 1, 'x'), 9)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TcpTransport, DisconnectFailsPendingAndTellsThePeer) {
  Node a, b;
  const PeerHandle ab = ConnectPair(a, b);
  a.t->Disconnect_st(ab, MonotonicNow());
  ASSERT_EQ(a.h.down.size(), 1u);  // reported synchronously
  EXPECT_EQ(a.h.down[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return !b.h.down.empty(); }));
  EXPECT_EQ(b.h.down[0].second.code(), absl::StatusCode::kUnavailable) << b.h.down[0].second;
  EXPECT_NE(b.h.down[0].second.message().find("shutdown"), absl::string_view::npos);
  EXPECT_EQ(b.t->Stats().malformed(), 0u);
}

TEST(TcpTransport, RemoveJobClosesItsPeers) {
  Node a, b;
  const PeerHandle ab = ConnectPair(a, b);
  std::vector<uint8_t> src(10);
  SendSpec s;
  s.region = *a.t->RegisterRegion_st(src.data(), src.size());
  s.length = 10;
  ASSERT_TRUE(a.t->PostSend_st(ab, s).ok());
  ASSERT_TRUE(a.t->RemoveJob_st(kJob).ok());
  ASSERT_EQ(a.h.failed.size(), 1u);
  EXPECT_EQ(a.h.failed[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(a.h.down.size(), 1u);
  EXPECT_EQ(a.h.down[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] { return !b.h.down.empty(); }));
  EXPECT_EQ(b.h.down[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.t->Connect_st(Job(0), "127.0.0.1:1", MonotonicNow()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.t->RemoveJob_st(kJob).code(), absl::StatusCode::kNotFound);
}

// Connections that never present a token are capped apart from the slot pool: past
// max_unauthenticated the oldest is evicted, and an authenticated peer still gets in.
TEST(TcpTransport, TokenlessConnectionsAreCappedAndDoNotStarveRealPeers) {
  TransportOptions o = Opts();
  o.max_unauthenticated = 3;
  Node a(o), b(o);
  ASSERT_TRUE(a.t && b.t);
  const uint16_t port = *b.t->Listen_st();
  std::vector<std::unique_ptr<RawPeer>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<RawPeer>(port));
    ASSERT_TRUE(idle.back()->connected());  // the kernel completes the connect; we evict
  }
  ASSERT_TRUE(PumpUntil({b.t.get()}, [&] { return b.t->Stats().unauthenticated_evicted >= 5; }));
  EXPECT_EQ(b.t->Stats().unauthenticated_evicted, 5u);
  EXPECT_EQ(b.t->Stats().accepts_refused, 0u);
  // The three pending hellos hold three slots; the real dial still has the rest.
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  auto h = a.t->Connect_st(Job(0), Addr(port), MonotonicNow());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(
      PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.up.size() == 1 && b.h.up.size() == 1; }));
}

TEST(TcpTransport, AFloodOfTokenlessConnectionsPinsLittleMemoryAndNoneAfterwards) {
  // Before: every slot a connection had ever used kept a full send ring and ack buffer
  // (~147 KiB at the default 1024 pending sends), so a flood's memory stayed pinned for good.
  TransportOptions o = Opts();
  o.max_connections = 64;
  o.max_unauthenticated = 16;
  Node a(o), b(o);
  ASSERT_TRUE(a.t && b.t);
  const uint16_t port = *b.t->Listen_st();
  ASSERT_TRUE(a.t->AddJob_st(Job(0)).ok());
  ASSERT_TRUE(b.t->AddJob_st(Job(1)).ok());
  auto h = a.t->Connect_st(Job(0), Addr(port), MonotonicNow());
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(
      PumpUntil({a.t.get(), b.t.get()}, [&] { return a.h.up.size() == 1 && b.h.up.size() == 1; }));
  // One authenticated connection each way is what real peers hold: the baseline.
  const uint64_t baseline = b.t->Stats().connection_buffer_bytes;
  EXPECT_GT(baseline, 0u);
  std::vector<std::unique_ptr<RawPeer>> flood;
  for (int i = 0; i < 40; ++i) {
    flood.push_back(std::make_unique<RawPeer>(port));
    ASSERT_TRUE(flood.back()->connected());
  }
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()}, [&] {
    const TransportStats st = b.t->Stats();
    return st.unauthenticated_evicted + 16 >= 40;
  }));
  // While it lasts: at most max_unauthenticated handshake-sized buffers on top of the baseline,
  // far less than one authenticated connection's storage each.
  const uint64_t during = b.t->Stats().connection_buffer_bytes;
  EXPECT_LE(during - baseline, uint64_t{16} * baseline / 8) << during << " vs " << baseline;
  // After it: back to the baseline.
  flood.clear();
  ASSERT_TRUE(PumpUntil({a.t.get(), b.t.get()},
                        [&] { return b.t->Stats().connection_buffer_bytes == baseline; }))
      << b.t->Stats().connection_buffer_bytes << " vs " << baseline;
  // And the real peer still works.
  EXPECT_EQ(a.h.down.size(), 0u);
}

}  // namespace
}  // namespace gradlane::transport
