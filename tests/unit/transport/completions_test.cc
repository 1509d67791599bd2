// transport/common/completions.h: every send ends once, a peer going down fails its pending sends
// in post order before the one OnPeerDown_st, and every event is counted before it is told.
#include "transport/common/completions.h"

#include <deque>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/transport/recording_handler.h"

namespace gradlane::transport {
namespace {

using testing::RecordingHandler;

constexpr PeerHandle kPeer = 0x10003;

PendingSend Pending(uint64_t cookie, uint64_t length = 10) {
  PendingSend s;
  s.header = MakeHeader(FrameType::kData, 1, 0);
  s.header.key = 100 + cookie;
  s.header.length = length;
  s.cookie = cookie;
  return s;
}

PeerInfo Info() {
  PeerInfo p;
  p.handle = kPeer;
  p.job_id = 1;
  p.rank = 2;
  return p;
}

struct Fixture {
  // Pops the oldest of `queue`, as a backend's ring or deque would.
  auto Popper() {
    return [this]() -> const PendingSend* {
      if (queue.empty()) return nullptr;
      popped = queue.front();
      queue.pop_front();
      return &popped;
    };
  }
  RecordingHandler h;
  TransportCounters counters;
  PeerCounters peer;
  Completions report{&h, &counters};
  std::deque<PendingSend> queue;
  PendingSend popped;
  bool known = true;
};

TEST(Completions, FailPendingFailsInOrderThenReportsDownOnce) {
  Fixture f;
  for (uint64_t i = 0; i < 4; ++i) f.queue.push_back(Pending(i));
  const absl::Status why = absl::UnavailableError("reset");
  f.report.FailPendingAndReportDown(Info(), f.known, f.peer, f.Popper(), why);
  ASSERT_EQ(f.h.failed.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(f.h.failed[i].first.cookie, i);
    EXPECT_EQ(f.h.failed[i].first.peer, kPeer);
    EXPECT_EQ(f.h.failed[i].first.key, 100 + i);
    EXPECT_EQ(f.h.failed[i].second, why);
  }
  ASSERT_EQ(f.h.down.size(), 1u);
  EXPECT_EQ(f.h.down[0].first.handle, kPeer);
  EXPECT_EQ(f.h.down[0].second, why);
  EXPECT_FALSE(f.known);
  EXPECT_EQ(f.peer.sends_failed.Get(), 4u);
  EXPECT_EQ(f.counters.total.sends_failed.Get(), 4u);
  EXPECT_EQ(f.counters.peers_down.Get(), 1u);

  // A second teardown of the same connection tells the engine nothing more.
  f.report.FailPendingAndReportDown(Info(), f.known, f.peer, f.Popper(), why);
  EXPECT_EQ(f.h.failed.size(), 4u);
  EXPECT_EQ(f.h.down.size(), 1u);
  EXPECT_EQ(f.counters.peers_down.Get(), 1u);
}

TEST(Completions, UnknownPeerGetsItsSendsFailedButNoPeerDown) {
  Fixture f;
  f.known = false;  // e.g. an inbound connection that never came up
  f.queue.push_back(Pending(0));
  f.report.FailPendingAndReportDown(Info(), f.known, f.peer, f.Popper(), absl::CancelledError("x"));
  EXPECT_EQ(f.h.failed.size(), 1u);
  EXPECT_TRUE(f.h.down.empty());
  EXPECT_EQ(f.counters.peers_down.Get(), 0u);
}

// A handler that tears the same connection down again from inside the first failure.
class ReentrantHandler : public RecordingHandler {
 public:
  void OnSendFailed_st(const SendCompletion& s, const absl::Status& why) override {
    RecordingHandler::OnSendFailed_st(s, why);
    if (reenter) {
      reenter = false;
      again();
    }
  }
  bool reenter = true;
  std::function<void()> again;
};

TEST(Completions, ReentrantTeardownStillFailsEachSendOnceInOrderBeforeTheDown) {
  ReentrantHandler h;
  TransportCounters counters;
  PeerCounters peer;
  Completions report(&h, &counters);
  std::vector<PendingSend> ring;
  for (uint64_t i = 0; i < 5; ++i) ring.push_back(Pending(i));
  size_t next = 0;
  bool known = true;
  auto pop = [&]() -> const PendingSend* { return next < ring.size() ? &ring[next++] : nullptr; };
  h.again = [&] {
    report.FailPendingAndReportDown(Info(), known, peer, pop, absl::CancelledError("inner"));
  };
  report.FailPendingAndReportDown(Info(), known, peer, pop, absl::UnavailableError("outer"));
  ASSERT_EQ(h.failed.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(h.failed[i].first.cookie, i);
  // The outer call cleared `known` first: it owns the one peer-down, after every failure.
  ASSERT_EQ(h.down.size(), 1u);
  EXPECT_EQ(h.down[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(peer.sends_failed.Get(), 5u);
}

TEST(Completions, AckAndRejectedAck) {
  Fixture f;
  f.report.SendAcked(kPeer, 3, f.peer, Pending(7), /*rejected=*/false, 123);
  ASSERT_EQ(f.h.acked.size(), 1u);
  EXPECT_EQ(f.h.acked[0].cookie, 7u);
  f.report.SendAcked(kPeer, 3, f.peer, Pending(8), /*rejected=*/true, 124);
  ASSERT_EQ(f.h.failed.size(), 1u);
  EXPECT_EQ(f.h.failed[0].first.cookie, 8u);
  EXPECT_EQ(f.h.failed[0].second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f.peer.acks_received.Get(), 2u);
  EXPECT_EQ(f.counters.total.acks_received.Get(), 2u);
  EXPECT_EQ(f.peer.sends_failed.Get(), 1u);
  EXPECT_EQ(f.counters.total.sends_failed.Get(), 1u);
}

// Counted before told: a handler that reads the stats sees its own event.
class StatsReadingHandler : public RecordingHandler {
 public:
  void OnSendDone_st(const SendCompletion& s) override {
    RecordingHandler::OnSendDone_st(s);
    seen_frames_sent = counters->total.frames_sent.Get();
  }
  void OnPeerUp_st(const PeerInfo& p) override {
    RecordingHandler::OnPeerUp_st(p);
    seen_peers_up = counters->peers_up.Get();
  }
  const TransportCounters* counters = nullptr;
  uint64_t seen_frames_sent = 0, seen_peers_up = 0;
};

TEST(Completions, UpSentReceivedAreCountedBeforeTheHandlerHearsOfThem) {
  StatsReadingHandler h;
  TransportCounters counters;
  h.counters = &counters;
  PeerCounters peer;
  Completions report(&h, &counters);
  report.PeerUp(Info());
  EXPECT_EQ(h.seen_peers_up, 1u);
  report.SendLeft(kPeer, peer, Pending(1, 300));
  EXPECT_EQ(h.seen_frames_sent, 1u);
  ASSERT_EQ(h.done.size(), 1u);
  EXPECT_EQ(h.done[0].length, 300u);
  EXPECT_EQ(peer.bytes_sent.Get(), 300u);
  EXPECT_EQ(counters.total.bytes_sent.Get(), 300u);
  FrameHeader hdr = MakeHeader(FrameType::kData, 1, 2);
  hdr.length = 50;
  report.Received(Info(), peer, hdr, RecvTarget::Into(0, 0), 5);
  EXPECT_EQ(h.received.size(), 1u);
  EXPECT_EQ(peer.bytes_received.Get(), 50u);
  EXPECT_EQ(counters.total.frames_received.Get(), 1u);
  report.AckSent(peer);
  EXPECT_EQ(peer.acks_sent.Get(), 1u);
  report.CountError(WireError::kNoTarget);
  EXPECT_EQ(counters.Snapshot().errors[static_cast<size_t>(WireError::kNoTarget)], 1u);
}

}  // namespace
}  // namespace gradlane::transport
