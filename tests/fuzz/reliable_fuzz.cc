// Fuzz target: the reliable datagram protocol's receive path (transport/datagram/, the transport
// and the pieces it is built from): every datagram anyone can send to the DPDK port, fed to
// DatagramTransport::OnDatagram_st, interleaved with timers (Progress_st) and our own sends so
// acknowledgement, retransmission, reordering and teardown paths run on hostile input.
//
// Input: one mode byte, then records. Mode bits:
//   0: a valid peer first says hello (an inbound connection is up before the fuzzed datagrams)
//   1: we dial the fuzzing peer (an outbound connection waiting for its hello-ok)
//   2: patch each datagram's header so it reaches a connection (magic, version, connection ids,
//      payload_bytes); without it the fuzzer must find them itself
//   3: received segments are handed over in pieces (RecvTarget::Pieces) instead of written
//   4: a receive budget (rx_budget_packets) splits the credit among inbound connections
// Records: op byte, then op % 4 == 0: u16 length + that many datagram bytes; 1: one byte of
// time to advance (x 50 us) and a Progress_st; 2: a send of u16 bytes to the peer; 3: the peer
// is disconnected (next byte 0), its job removed and registered again (1), the link refuses
// sends until the next such op (2: "link full").
// The handler checks the transport's promises: pieces and placements stay inside the segment
// and the target region, a segment completes at most once per delivery.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "transport/datagram/datagram_transport.h"

namespace {

using namespace gradlane::transport;            // NOLINT
using namespace gradlane::transport::datagram;  // NOLINT

constexpr Ipv4Endpoint kUs{0x0a000001, 7610};
constexpr Ipv4Endpoint kPeer{0x0a000002, 7610};
constexpr uint64_t kJob = 7;
constexpr uint32_t kPeerConn = 77;
constexpr size_t kRegionBytes = 64 << 10;

class FuzzLink final : public DatagramLink {
 public:
  uint32_t max_datagram_bytes() const override { return 600; }
  Ipv4Endpoint local_endpoint() const override { return kUs; }
  bool Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
               std::span<const uint8_t> body) override {
    if (to == kPeer && head.size() >= sizeof(DgramHeader)) {
      DgramHeader h;
      std::memcpy(&h, head.data(), sizeof(h));
      our_conn = h.src_conn;  // the connection id the peer must address
    }
    (void)body;
    return !full;
  }
  void Flush_st() override {}
  int Poll_st(DatagramSink*, gradlane::sched::TimeNs, gradlane::sched::TimeNs) override {
    return 0;
  }
  uint32_t our_conn = 0;
  bool full = false;
};

class FuzzHandler final : public TransportHandler {
 public:
  void OnPeerUp_st(const PeerInfo& p) override { peer = p.handle; }
  void OnPeerDown_st(const PeerInfo& p, const absl::Status&) override {
    if (p.handle == peer) peer = kNoPeer;
  }
  void OnSendDone_st(const SendCompletion&) override {}
  void OnSendAcked_st(const SendCompletion&, TimeNs) override {}
  void OnSendFailed_st(const SendCompletion&, const absl::Status&) override {}
  RecvTarget ResolveRecv_st(const PeerInfo&, const FrameHeader& h) override {
    if (h.length > kRegionBytes / 2) return RecvTarget::Reject();
    const uint64_t off = h.offset % (kRegionBytes / 2);
    return pieces ? RecvTarget::Pieces(region, off) : RecvTarget::Into(region, off);
  }
  void OnRecvPiece_st(const PeerInfo&, const FrameHeader& h, const RecvTarget&,
                      uint64_t segment_offset, std::span<const uint8_t> bytes) override {
    if (segment_offset > h.length || bytes.size() > h.length - segment_offset) std::abort();
    if (segment_offset == 0) piece_next = 0;         // a new segment (an earlier one may have died)
    if (segment_offset != piece_next) std::abort();  // pieces are contiguous, in order
    piece_next = segment_offset + bytes.size();
    for (uint8_t b : bytes) checksum ^= b;  // ASan: the span must be readable
  }
  void OnRecvDone_st(const PeerInfo&, const FrameHeader& h, const RecvTarget& t, TimeNs) override {
    if (t.by_piece && piece_next != h.length) std::abort();
    piece_next = 0;
  }
  PeerHandle peer = kNoPeer;
  RegionId region = kNoRegion;
  bool pieces = false;
  uint64_t piece_next = 0;
  uint8_t checksum = 0;
};

struct Reader {
  const uint8_t* p;
  size_t n;
  bool Take(void* out, size_t k) {
    if (n < k) return false;
    if (k != 0) std::memcpy(out, p, k);
    p += k;
    n -= k;
    return true;
  }
};

std::vector<uint8_t> ValidHello(uint16_t rank) {
  DgramHeader dh{};
  dh.magic = kDgramMagic;
  dh.version = kDgramVersion;
  dh.type = static_cast<uint8_t>(DgramType::kHello);
  dh.src_conn = kPeerConn;
  dh.credit = 64;
  dh.payload_bytes = kFrameHeaderBytes + kHelloBodyBytes;
  FrameHeader fh = MakeHeader(FrameType::kHello, kJob, rank);
  fh.payload_bytes = kHelloBodyBytes;
  HelloBody b{};
  b.rank = rank;
  b.world_size = 2;
  b.token_bytes = 3;
  std::memcpy(b.token, "tok", 3);
  std::vector<uint8_t> d(sizeof(dh) + sizeof(fh) + sizeof(b));
  std::memcpy(d.data(), &dh, sizeof(dh));
  std::memcpy(d.data() + sizeof(dh), &fh, sizeof(fh));
  std::memcpy(d.data() + sizeof(dh) + sizeof(fh), &b, sizeof(b));
  return d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader in{data, size};
  uint8_t mode = 0;
  if (!in.Take(&mode, 1)) return 0;
  static std::vector<uint8_t> region_bytes(kRegionBytes);
  static std::vector<uint8_t> send_bytes(kRegionBytes, 0x5a);

  TransportOptions o;
  o.max_connections = 4;
  o.max_pending_sends_per_peer = 16;
  o.max_segment_bytes = 1 << 20;
  o.peer_timeout = 50 * gradlane::sched::kMillisecond;
  o.connect_deadline = 200 * gradlane::sched::kMillisecond;
  DatagramOptions r;
  r.window_packets = 16;
  if (mode & 16) r.rx_budget_packets = 24;
  FuzzLink link;
  FuzzHandler handler;
  handler.pieces = (mode & 8) != 0;
  auto t = DatagramTransport::Create(o, r, &link, &handler);
  if (!t.ok()) std::abort();
  DatagramTransport& tr = **t;
  if (!tr.Listen_st().ok()) std::abort();
  JobCredentials job{kJob, 0, 2, "tok"};
  if (!tr.AddJob_st(job).ok()) std::abort();
  auto region = tr.RegisterRegion_st(region_bytes.data(), region_bytes.size());
  auto send_region = tr.RegisterRegion_st(send_bytes.data(), send_bytes.size());
  if (!region.ok() || !send_region.ok()) std::abort();
  handler.region = *region;

  TimeNs now = 1000 * gradlane::sched::kMillisecond;
  if (mode & 1) {
    const std::vector<uint8_t> hello = ValidHello(1);
    tr.OnDatagram_st(kPeer, hello, now);
  } else if (mode & 2) {
    auto p = tr.Connect_st(job, "10.0.0.2:7610", now);
    if (!p.ok()) std::abort();
    handler.peer = *p;             // sends queue until it is up
    (void)tr.Progress_st(now, 0);  // sends the hello: the peer learns our connection id
  }
  uint64_t cookie = 0;
  for (int steps = 0; steps < 256; ++steps) {
    uint8_t op = 0;
    if (!in.Take(&op, 1)) break;
    switch (op % 4) {
      case 0: {
        uint16_t len = 0;
        if (!in.Take(&len, 2)) break;
        len = static_cast<uint16_t>(len % 1024);
        std::vector<uint8_t> d(len);
        if (!in.Take(d.data(), len)) break;
        if ((mode & 4) && len >= sizeof(DgramHeader)) {
          DgramHeader h;
          std::memcpy(&h, d.data(), sizeof(h));
          h.magic = kDgramMagic;
          h.version = kDgramVersion;
          h.type =
              static_cast<uint8_t>(1 + (h.type + kMaxDgramType - 1) % kMaxDgramType);  // 1..6 kept
          h.flags &= kKnownPktFlags;
          h.dst_conn = link.our_conn;
          h.src_conn = kPeerConn;
          h.payload_bytes = static_cast<uint32_t>(len - sizeof(h));
          h.reserved = 0;
          std::memcpy(d.data(), &h, sizeof(h));
        }
        tr.OnDatagram_st(kPeer, d, now);
        break;
      }
      case 1: {
        uint8_t dt = 0;
        if (!in.Take(&dt, 1)) break;
        now += static_cast<TimeNs>(dt) * 50 * gradlane::sched::kMicrosecond;
        (void)tr.Progress_st(now, 0);
        break;
      }
      case 2: {
        uint16_t len = 0;
        if (!in.Take(&len, 2) || handler.peer == kNoPeer) break;
        SendSpec s;
        s.key = cookie;
        s.length = 1 + len % 4096;
        s.region = *send_region;
        s.cookie = ++cookie;
        (void)tr.PostSend_st(handler.peer, s);
        break;
      }
      case 3: {
        uint8_t b = 3;
        if (!in.Take(&b, 1)) break;
        if (b == 0 && handler.peer != kNoPeer) tr.Disconnect_st(handler.peer, now);
        if (b == 1) {
          if (!tr.RemoveJob_st(kJob).ok() || !tr.AddJob_st(job).ok()) std::abort();
        }
        if (b == 2) link.full = !link.full;
        break;
      }
    }
  }
  now += 10 * gradlane::sched::kMillisecond;
  (void)tr.Progress_st(now, 0);
  const TransportStats st = tr.Stats();
  if (std::getenv("RELIABLE_FUZZ_DEBUG") != nullptr) {  // what an input reached, for seed work
    const DatagramStats rs = tr.DatagramStatsNow();
    std::fprintf(stderr, "up %llu down %llu rx frames %llu stray %llu errors:",
                 (unsigned long long)st.peers_up, (unsigned long long)st.peers_down,
                 (unsigned long long)st.total.frames_received, (unsigned long long)rs.stray);
    for (size_t i = 0; i < kWireErrorCount; ++i) {
      if (st.errors[i] != 0) {
        std::fprintf(stderr, " %s=%llu",
                     std::string(WireErrorName(static_cast<WireError>(i))).c_str(),
                     (unsigned long long)st.errors[i]);
      }
    }
    std::fprintf(stderr, "\n");
  }
  return 0;
}
