// The in-memory fake on virtual time: exact delivery times, order, refusals and both kinds of
// vanished peer — the behaviour scheduler/daemon tests will lean on.
#include "tests/fakes/fake_transport.h"

#include <memory>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/transport/recording_handler.h"

namespace gradlane::transport {
namespace {

using fake::FakeNetwork;
using fake::FakeTransport;
using testing::RecordingHandler;

constexpr TimeNs kMs = sched::kMillisecond;
constexpr uint64_t kJob = 9;

JobCredentials Job(uint16_t rank, std::string token = "tok") {
  return JobCredentials{kJob, rank, 2, std::move(token)};
}

TransportOptions Opts() {
  TransportOptions o;
  o.listen_address = "10.0.0.2";
  o.listen_port = 7000;
  o.peer_timeout = 100 * kMs;
  o.connect_initial_backoff = 10 * kMs;
  o.connect_max_backoff = 40 * kMs;
  o.connect_deadline = 1000 * kMs;
  o.connect_attempt_timeout = 50 * kMs;
  return o;
}

// Through the abstract interface, as the engine drives every backend.
void StepAll(TimeNs now, Transport& a, Transport& b) {
  a.Progress_st(now, 0);
  b.Progress_st(now, 0);
}

struct Pair {
  explicit Pair(TimeNs delay = 1 * kMs, TransportOptions o = Opts()) {
    net.set_delay(delay);
    a = *FakeTransport::Create(o, &ha, &net);
    b = *FakeTransport::Create(o, &hb, &net);
    EXPECT_TRUE(b->Listen_st().ok());
    EXPECT_TRUE(a->AddJob_st(Job(0)).ok());
    EXPECT_TRUE(b->AddJob_st(Job(1)).ok());
  }
  void RunTo(TimeNs until, TimeNs step = 1 * kMs) {
    for (; now <= until; now += step) StepAll(now, *a, *b);
    now = until;
  }
  FakeNetwork net;
  RecordingHandler ha, hb;
  std::unique_ptr<FakeTransport> a, b;
  TimeNs now = 0;
};

TEST(FakeTransport, DeliversInOrderAfterTheConfiguredDelay) {
  Pair p(2 * kMs);
  const PeerHandle ab = *p.a->Connect_st(Job(0), "10.0.0.2:7000", 0);
  p.a->Progress_st(0, 0);  // hello leaves at 0
  p.b->Progress_st(1 * kMs, 0);
  EXPECT_TRUE(p.hb.up.empty()) << "delivered before its delay";
  p.b->Progress_st(2 * kMs, 0);  // hello arrives at 2 ms
  ASSERT_EQ(p.hb.up.size(), 1u);
  p.a->Progress_st(4 * kMs, 0);  // hello-ok arrives at 4 ms
  ASSERT_EQ(p.ha.up.size(), 1u);
  EXPECT_EQ(p.ha.up[0].rank, 1);

  std::vector<uint8_t> src(1000), dst(1000, 0);
  std::iota(src.begin(), src.end(), 0);
  const RegionId s = *p.a->RegisterRegion_st(src.data(), src.size());
  const RegionId d = *p.b->RegisterRegion_st(dst.data(), dst.size());
  p.hb.resolve = [&](const PeerInfo&, const FrameHeader& h) {
    return RecvTarget::Into(d, h.offset);
  };
  const uint64_t sizes[] = {1, 499, 500};
  uint64_t off = 0;
  for (int i = 0; i < 3; ++i) {
    SendSpec spec;
    spec.key = sched::MakeKey(1, i);
    spec.offset = off;
    spec.length = sizes[i];
    spec.region = s;
    spec.region_offset = off;
    spec.cookie = i;
    ASSERT_TRUE(p.a->PostSend_st(ab, spec).ok());
    off += sizes[i];
  }
  p.a->Progress_st(4 * kMs, 0);
  EXPECT_EQ(p.ha.done.size(), 3u);
  p.b->Progress_st(5 * kMs, 0);
  EXPECT_TRUE(p.hb.received.empty());
  p.b->Progress_st(6 * kMs, 0);
  ASSERT_EQ(p.hb.received.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(sched::KeyPartition(p.hb.received[i].header.key), static_cast<uint32_t>(i));
  EXPECT_TRUE(src == dst);
  p.a->Progress_st(7 * kMs, 0);
  EXPECT_TRUE(p.ha.acked.empty());
  p.a->Progress_st(8 * kMs, 0);
  ASSERT_EQ(p.ha.acked.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(p.ha.acked[i].cookie, static_cast<uint64_t>(i));
  EXPECT_EQ(p.a->PeerStatsOf(ab).bytes_sent, 1000u);
  EXPECT_EQ(p.b->Stats().total.bytes_received, 1000u);
}

TEST(FakeTransport, WrongTokenIsRejectedLikeTcp) {
  Pair p;
  ASSERT_TRUE(p.a->AddJob_st(JobCredentials{kJob + 1, 0, 2, "tok"}).ok());
  // Job kJob+1 is unknown to b; the token of kJob is right. Then a wrong token for kJob.
  RecordingHandler hc;
  auto c = *FakeTransport::Create(Opts(), &hc, &p.net);
  ASSERT_TRUE(c->AddJob_st(Job(0, "bad")).ok());
  ASSERT_TRUE(c->Connect_st(Job(0, "bad"), "10.0.0.2:7000", 0).ok());
  ASSERT_TRUE(p.a->Connect_st(JobCredentials{kJob + 1, 0, 2, "tok"}, "10.0.0.2:7000", 0).ok());
  for (TimeNs t = 0; t < 10 * kMs; t += kMs) {
    c->Progress_st(t, 0);
    StepAll(t, *p.a, *p.b);
  }
  ASSERT_EQ(hc.down.size(), 1u);
  EXPECT_EQ(hc.down[0].second.code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(p.ha.down.size(), 1u);
  EXPECT_EQ(p.ha.down[0].second.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(p.hb.up.empty());
  EXPECT_EQ(p.b->Stats().errors[static_cast<size_t>(WireError::kAuthFailed)], 1u);
  EXPECT_EQ(p.b->Stats().errors[static_cast<size_t>(WireError::kUnknownJob)], 1u);
}

// Connects, then posts `n` sends of 10 bytes without letting b run.
PeerHandle ConnectAndPost(Pair& p, int n, std::vector<uint8_t>& buf) {
  const PeerHandle ab = *p.a->Connect_st(Job(0), "10.0.0.2:7000", p.now);
  p.RunTo(5 * kMs);
  EXPECT_EQ(p.ha.up.size(), 1u);
  const RegionId r = *p.a->RegisterRegion_st(buf.data(), buf.size());
  for (int i = 0; i < n; ++i) {
    SendSpec s;
    s.region = r;
    s.length = 10;
    s.cookie = i;
    EXPECT_TRUE(p.a->PostSend_st(ab, s).ok());
  }
  return ab;
}

TEST(FakeTransport, KilledPeerFailsPendingSendsAtOnce) {
  Pair p;
  std::vector<uint8_t> buf(10);
  ConnectAndPost(p, 4, buf);
  p.net.Kill(p.b->address(), /*silent=*/false);
  p.a->Progress_st(p.now, 0);  // reset is delivered without delay
  ASSERT_EQ(p.ha.down.size(), 1u);
  EXPECT_EQ(p.ha.down[0].second.code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(p.ha.failed.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(p.ha.failed[i].first.cookie, static_cast<uint64_t>(i));
}

TEST(FakeTransport, SilentPeerTimesOutAfterPeerTimeout) {
  Pair p;
  std::vector<uint8_t> buf(10);
  const PeerHandle ab = ConnectAndPost(p, 2, buf);
  p.net.Kill("10.0.0.2:7000", /*silent=*/true);
  const TimeNs posted = p.now;
  p.a->Progress_st(posted, 0);
  p.a->Progress_st(posted + 100 * kMs, 0);
  EXPECT_TRUE(p.ha.down.empty()) << "timed out early";
  p.a->Progress_st(posted + 100 * kMs + 1, 0);
  ASSERT_EQ(p.ha.down.size(), 1u);
  EXPECT_EQ(p.ha.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(p.ha.failed.size(), 2u);
  EXPECT_EQ(p.a->Stats().peer_timeouts, 1u);
  EXPECT_EQ(p.a->PostSend_st(ab, SendSpec{}).code(), absl::StatusCode::kNotFound);
}

TEST(FakeTransport, ConnectRetriesThenGivesUp) {
  FakeNetwork net;
  RecordingHandler ha, hb;
  TransportOptions o = Opts();
  auto a = *FakeTransport::Create(o, &ha, &net);
  ASSERT_TRUE(a->AddJob_st(Job(0)).ok());
  a->Connect_st(Job(0), "10.0.0.2:7000", 0).IgnoreError();
  for (TimeNs t = 0; t <= 60 * kMs; t += kMs) a->Progress_st(t, 0);
  EXPECT_GE(a->Stats().connect_retries, 2u);
  EXPECT_TRUE(ha.down.empty());
  // The listener appears: the next retry gets through.
  auto b = *FakeTransport::Create(o, &hb, &net);
  ASSERT_TRUE(b->Listen_st().ok());
  ASSERT_TRUE(b->AddJob_st(Job(1)).ok());
  for (TimeNs t = 61 * kMs; t <= 200 * kMs && ha.up.empty(); t += kMs) StepAll(t, *a, *b);
  EXPECT_EQ(ha.up.size(), 1u);
  // A dial to nowhere gives up at the deadline.
  a->Connect_st(Job(0), "10.9.9.9:1", 0).IgnoreError();
  for (TimeNs t = 200 * kMs; t < 1000 * kMs; t += kMs) a->Progress_st(t, 0);
  EXPECT_TRUE(ha.down.empty());
  for (TimeNs t = 1000 * kMs; t <= 1100 * kMs; t += kMs) a->Progress_st(t, 0);
  ASSERT_EQ(ha.down.size(), 1u);
  EXPECT_EQ(ha.down[0].second.code(), absl::StatusCode::kDeadlineExceeded);
  // Busy address, as with TCP.
  RecordingHandler hc;
  auto c = *FakeTransport::Create(o, &hc, &net);
  EXPECT_EQ(c->Listen_st().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(FakeTransport, ResolverRejectFailsTheSend) {
  Pair p;
  std::vector<uint8_t> buf(10);
  ConnectAndPost(p, 1, buf);  // hb.resolve is unset: every segment is rejected
  p.RunTo(20 * kMs);
  ASSERT_EQ(p.ha.failed.size(), 1u);
  EXPECT_EQ(p.ha.failed[0].second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(p.ha.down.empty());
  EXPECT_EQ(p.b->Stats().errors[static_cast<size_t>(WireError::kNoTarget)], 1u);
}

}  // namespace
}  // namespace gradlane::transport
