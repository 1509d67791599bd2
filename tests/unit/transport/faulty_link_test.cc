// The fault-injecting link wrapper (transport/datagram/faulty_link.h): drop every Nth and with a
// probability, duplicate back to back, reorder by holding one datagram until the next goes out,
// the counts it reports, replay by seed, and what it does when the link under it is full.
#include "transport/datagram/faulty_link.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace gradlane::transport::datagram {
namespace {

// Records what reaches it: the first byte of each head is the datagram's number.
class RecordingLink final : public DatagramLink {
 public:
  uint32_t max_datagram_bytes() const override { return 1500; }
  Ipv4Endpoint local_endpoint() const override { return {0x0A000001, 7610}; }
  bool Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
               std::span<const uint8_t> body) override {
    if (full) return false;
    got.push_back(head[0]);
    tos.push_back(to);
    heads.emplace_back(head.begin(), head.end());
    bodies.push_back(body);
    return true;
  }
  void Flush_st() override { ++flushes; }
  int Poll_st(DatagramSink*, TimeNs, TimeNs) override { return ++polls; }
  uint32_t rx_capacity_packets() const override { return 512; }

  bool full = false;
  std::vector<int> got;
  std::vector<Ipv4Endpoint> tos;
  std::vector<std::vector<uint8_t>> heads;
  std::vector<std::span<const uint8_t>> bodies;
  int flushes = 0, polls = 0;
};

constexpr Ipv4Endpoint kTo{0x0A000002, 7610};

// Sends datagrams 0..n-1 (one head byte each) and releases whatever is held at the end.
void SendNumbered(FaultyLink& f, int n) {
  for (int i = 0; i < n; ++i) {
    const uint8_t head[1] = {static_cast<uint8_t>(i)};
    EXPECT_TRUE(f.Send_st(kTo, head, {}));
  }
  f.ReleaseHeld_st();
}

TEST(FaultyLink, DropsEveryNth) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.drop_every = 3}, 64);
  SendNumbered(f, 10);
  EXPECT_EQ(inner.got, (std::vector<int>{0, 1, 3, 4, 6, 7, 9}));
  const FaultStats s = f.Stats();
  EXPECT_EQ(s.drops, 3u);
  EXPECT_EQ(s.sent, 7u);
  EXPECT_EQ(s.reorders + s.duplicates, 0u);
}

TEST(FaultyLink, DropsWithAProbabilityReplayedBySeed) {
  const FaultOptions o{.drop_probability = 0.2, .seed = 3};
  RecordingLink a, b, c;
  FaultyLink fa(&a, o, 64), fb(&b, o, 64);
  FaultOptions other = o;
  other.seed = 4;
  FaultyLink fc(&c, other, 64);
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) {
    const uint8_t head[1] = {static_cast<uint8_t>(i)};
    fa.Send_st(kTo, head, {});
    fb.Send_st(kTo, head, {});
    fc.Send_st(kTo, head, {});
  }
  EXPECT_EQ(a.got, b.got);  // same seed, same sends: the same datagrams lost
  EXPECT_NE(a.got, c.got);
  const FaultStats s = fa.Stats();
  EXPECT_EQ(s.drops + s.sent, static_cast<uint64_t>(kN));
  EXPECT_EQ(s.sent, a.got.size());
  // 4000 expected; 5 standard deviations (57) either way.
  EXPECT_GT(s.drops, 3700u);
  EXPECT_LT(s.drops, 4300u);
}

TEST(FaultyLink, DuplicatesGoOutBackToBack) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.duplicate_probability = 0.3, .seed = 5}, 64);
  SendNumbered(f, 1000);
  const FaultStats s = f.Stats();
  EXPECT_GT(s.duplicates, 200u);
  EXPECT_LT(s.duplicates, 400u);
  EXPECT_EQ(s.sent, 1000 + s.duplicates);
  ASSERT_EQ(inner.got.size(), s.sent);
  // In order, each datagram once or twice in a row.
  int expect = 0;
  uint64_t twice = 0;
  for (size_t i = 0; i < inner.got.size(); ++i) {
    if (i > 0 && inner.got[i] == inner.got[i - 1]) {
      ++twice;
      continue;
    }
    ASSERT_EQ(inner.got[i], expect % 256) << "at " << i;
    ++expect;
  }
  EXPECT_EQ(expect, 1000);
  EXPECT_EQ(twice, s.duplicates);
}

TEST(FaultyLink, ReorderHoldsOneUntilTheNextGoesOut) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.reorder_probability = 0.3, .seed = 6}, 64);
  for (int i = 0; i < 200; ++i) {
    const uint8_t head[1] = {static_cast<uint8_t>(i)};
    ASSERT_TRUE(f.Send_st(kTo, head, {}));
    ASSERT_EQ(inner.got.size(),
              static_cast<size_t>(i + 1 - (f.holding() ? 1 : 0)));  // one held at most
  }
  const bool held_last = f.holding();
  f.ReleaseHeld_st();
  EXPECT_FALSE(f.holding());
  const FaultStats s = f.Stats();
  EXPECT_GT(s.reorders, 20u);
  EXPECT_EQ(s.sent, 200u);  // nothing lost, nothing added
  ASSERT_EQ(inner.got.size(), 200u);
  // Only neighbours swap: a held datagram goes right after the one sent next.
  std::vector<int> sorted = inner.got;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(sorted[i], i);
  uint64_t swaps = 0;
  for (size_t i = 0; i < inner.got.size(); ++i) {
    if (inner.got[i] == static_cast<int>(i)) continue;
    ASSERT_EQ(inner.got[i], static_cast<int>(i) + 1) << "at " << i;
    ASSERT_EQ(inner.got[i + 1], static_cast<int>(i)) << "at " << i;
    ++swaps;
    ++i;
  }
  // The last datagram, if held, goes out at ReleaseHeld_st: last anyway.
  EXPECT_EQ(swaps + (held_last ? 1 : 0), s.reorders);
}

TEST(FaultyLink, HeldHeadIsCopiedBodyIsReferenced) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.reorder_probability = 0.999, .seed = 1}, 4);
  uint8_t head[4] = {1, 2, 3, 4};
  const uint8_t body[3] = {7, 8, 9};
  ASSERT_TRUE(f.Send_st(kTo, head, body));
  ASSERT_TRUE(f.holding());
  EXPECT_TRUE(inner.got.empty());
  head[1] = 99;  // the caller's head buffer is reused at once
  f.Flush_st();  // a flush does not release it
  EXPECT_TRUE(f.holding());
  EXPECT_EQ(inner.flushes, 1);
  f.ReleaseHeld_st();
  ASSERT_EQ(inner.heads.size(), 1u);
  EXPECT_EQ(inner.heads[0], (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(inner.bodies[0].data(), body);
  EXPECT_EQ(inner.tos[0], kTo);
  // A head longer than the hold buffer is never held back.
  const uint8_t long_head[5] = {5, 0, 0, 0, 0};
  ASSERT_TRUE(f.Send_st(kTo, long_head, {}));
  EXPECT_FALSE(f.holding());
  EXPECT_EQ(inner.got.back(), 5);
}

TEST(FaultyLink, FullInnerLinkIsReportedNotCounted) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.drop_every = 2}, 64);
  inner.full = true;
  const uint8_t head[1] = {0};
  EXPECT_FALSE(f.Send_st(kTo, head, {}));  // 1st: offered, no room
  EXPECT_TRUE(f.Send_st(kTo, head, {}));   // 2nd: dropped on purpose, whatever the link's room
  EXPECT_EQ(f.Stats().sent, 0u);
  EXPECT_EQ(f.Stats().drops, 1u);
  inner.full = false;
  EXPECT_TRUE(f.Send_st(kTo, head, {}));
  EXPECT_EQ(f.Stats().sent, 1u);
}

TEST(FaultyLink, ForwardsEverythingButSends) {
  RecordingLink inner;
  FaultyLink f(&inner, FaultOptions{.drop_every = 2}, 64);
  EXPECT_EQ(f.max_datagram_bytes(), 1500u);
  EXPECT_EQ(f.local_endpoint(), inner.local_endpoint());
  EXPECT_EQ(f.rx_capacity_packets(), 512u);
  EXPECT_EQ(f.Poll_st(nullptr, 0, 0), 1);
  EXPECT_EQ(inner.polls, 1);
}

// The pattern of a fixed seed is part of what gradlaned's --dpdk_fault_seed promises: the same
// seed replays the same faults, release after release. These counts are those of the fault
// injection this wrapper was taken out of (DatagramTransport's, computed independently from its
// generator and draw order): 1000 datagrams, every fault at once, seed 3.
TEST(FaultyLink, AllFaultsAtOnceWithAFixedSeed) {
  RecordingLink inner;
  const FaultOptions o{.drop_every = 7,
                       .drop_probability = 0.05,
                       .reorder_probability = 0.1,
                       .duplicate_probability = 0.05,
                       .seed = 3};
  FaultyLink f(&inner, o, 64);
  SendNumbered(f, 1000);
  const FaultStats s = f.Stats();
  EXPECT_EQ(s.sent, inner.got.size());
  EXPECT_EQ(s.sent, 1000 - s.drops + s.duplicates);
  EXPECT_EQ(s.sent, 856u);
  EXPECT_EQ(s.drops, 187u);
  EXPECT_EQ(s.duplicates, 43u);
  EXPECT_EQ(s.reorders, 82u);
}

TEST(FaultyLink, ValidateRefusesImpossibleOptions) {
  EXPECT_TRUE(FaultyLink::Validate({}).ok());
  EXPECT_TRUE(FaultyLink::Validate(FaultOptions{.drop_every = 2, .drop_probability = 0.5}).ok());
  EXPECT_EQ(FaultyLink::Validate(FaultOptions{.drop_every = 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(FaultyLink::Validate(FaultOptions{.drop_probability = 1}).ok());
  EXPECT_FALSE(FaultyLink::Validate(FaultOptions{.reorder_probability = -0.1}).ok());
  EXPECT_FALSE(FaultyLink::Validate(FaultOptions{.duplicate_probability = 1.5}).ok());
}

}  // namespace
}  // namespace gradlane::transport::datagram
