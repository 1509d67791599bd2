// "No allocation on the data path in steady state", checked: this binary replaces the global
// operator new with a counting one and drives send → receive → ack rounds over loopback.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/heap_counter.h"  // counts heap allocations
#include "tests/unit/transport/recording_handler.h"
#include "transport/tcp/tcp_transport.h"

namespace {
void* volatile sink = nullptr;
}  // namespace

namespace gradlane::transport {
namespace {

using testing::MonotonicNow;

// Counts callbacks without touching the heap.
class CountingHandler : public TransportHandler {
 public:
  void OnPeerUp_st(const PeerInfo& p) override {
    up = p;
    ++ups;
  }
  void OnPeerDown_st(const PeerInfo&, const absl::Status&) override { ++downs; }
  void OnSendDone_st(const SendCompletion&) override { ++done; }
  void OnSendAcked_st(const SendCompletion&, TimeNs) override { ++acked; }
  void OnSendFailed_st(const SendCompletion&, const absl::Status&) override { ++failed; }
  RecvTarget ResolveRecv_st(const PeerInfo&, const FrameHeader& h) override {
    return RecvTarget::Into(region, h.offset);
  }
  void OnRecvDone_st(const PeerInfo&, const FrameHeader&, const RecvTarget&, TimeNs) override {
    ++received;
  }
  RegionId region = kNoRegion;
  PeerInfo up;
  int ups = 0, downs = 0;
  long done = 0, acked = 0, failed = 0, received = 0;
};

TEST(TcpTransportNoAlloc, SteadyStateSendReceiveAckDoesNotAllocate) {
  TransportOptions o;
  o.listen_address = "127.0.0.1";
  o.max_connections = 4;
  o.max_pending_sends_per_peer = 256;
  CountingHandler ha, hb;
  auto a = *tcp::TcpTransport::Create(o, &ha);
  auto b = *tcp::TcpTransport::Create(o, &hb);
  const uint16_t port = *b->Listen_st();
  const JobCredentials ja{1, 0, 2, "token"}, jb{1, 1, 2, "token"};
  ASSERT_TRUE(a->AddJob_st(ja).ok());
  ASSERT_TRUE(b->AddJob_st(jb).ok());
  const PeerHandle ab = *a->Connect_st(ja, "127.0.0.1:" + std::to_string(port), MonotonicNow());
  std::vector<uint8_t> src(1 << 20, 7), dst(1 << 20);
  const RegionId rs = *a->RegisterRegion_st(src.data(), src.size());
  hb.region = *b->RegisterRegion_st(dst.data(), dst.size());
  const TimeNs deadline = MonotonicNow() + 5 * sched::kSecond;
  while ((ha.ups == 0 || hb.ups == 0) && MonotonicNow() < deadline) {
    a->Progress_st(MonotonicNow(), 1);
    b->Progress_st(MonotonicNow(), 1);
  }
  ASSERT_EQ(ha.ups, 1);

  auto round = [&](int sends) {
    const long target = ha.acked + sends;
    for (int i = 0; i < sends; ++i) {
      SendSpec s;
      s.region = rs;
      s.key = static_cast<sched::SegmentKey>(i);
      s.offset = static_cast<uint64_t>(i) * 4096;
      s.region_offset = s.offset;
      s.length = 1 + static_cast<uint64_t>(i) * 37 % 4096;
      ASSERT_TRUE(a->PostSend_st(ab, s).ok());
    }
    const TimeNs until = MonotonicNow() + 5 * sched::kSecond;
    while (ha.acked < target && MonotonicNow() < until) {
      a->Progress_st(MonotonicNow(), 0);
      b->Progress_st(MonotonicNow(), 0);
    }
    ASSERT_EQ(ha.acked, target);
  };
  round(200);  // warm-up: lazily grown structures (if any) reach their working size
  // The counter itself works (so a zero below means something).
  const uint64_t before_probe = gradlane_test::HeapAllocations();
  sink = new int(1);
  delete static_cast<int*>(sink);
  ASSERT_EQ(gradlane_test::HeapAllocations() - before_probe, 1u);
  const uint64_t before = gradlane_test::HeapAllocations();
  for (int r = 0; r < 5; ++r) round(200);
  EXPECT_EQ(gradlane_test::HeapAllocations() - before, 0u) << "heap allocations on the data path";
  EXPECT_EQ(ha.failed, 0);
  EXPECT_EQ(hb.received, 1200);
  EXPECT_EQ(ha.downs + hb.downs, 0);
}

}  // namespace
}  // namespace gradlane::transport
