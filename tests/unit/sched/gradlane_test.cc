// Unit tests of the gradlane policy's rules (sched/policies/gradlane.h): message time from the
// per-iteration load and θ, message size from the link rate, the window from the estimate,
// fusion that keeps each peer's priority order, and adaptation to a bandwidth change.
#include "sched/policies/gradlane.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace gradlane::sched {
namespace {

constexpr TimeNs kTheta = 50 * kMicrosecond;

Segment Seg(uint32_t tensor, Priority priority, uint16_t peer, uint64_t length) {
  Segment s;
  s.key = MakeKey(tensor, 0);
  s.priority = priority;
  s.peer = peer;
  s.length = length;
  return s;
}

ReadyRange Range(uint32_t tensor, Priority priority, uint16_t peer, uint64_t bytes,
                 int64_t iteration = 0) {
  ReadyRange r;
  r.tensor_id = tensor;
  r.priority = priority;
  r.peer = peer;
  r.iteration = iteration;
  r.tensor_bytes = bytes;
  r.length = bytes;
  return r;
}

std::unique_ptr<GradlanePolicy> Make(double bytes_per_s, TimeNs theta = kTheta) {
  PolicyConfig c;
  c.name = "gradlane";
  c.initial_bandwidth_bytes_per_s = bytes_per_s;
  c.per_message_overhead_ns = theta;
  return GradlanePolicy::Create(c);
}

TEST(GradlaneRulesTest, MessageTimeBalancesOverheadAgainstBlocking) {
  // τ = sqrt(N·θ / (2(P + 1))): 90 ms of traffic per iteration, θ = 50 µs, 2 peers -> 0.87 ms.
  EXPECT_NEAR(GradlaneMessageNs(90 * kMillisecond, kTheta, 2), 866025, 1000);
  // Four times the traffic: twice the message time (overhead share halves).
  EXPECT_NEAR(GradlaneMessageNs(360 * kMillisecond, kTheta, 2), 1732051, 1000);
  // More peers sharing each receiver: a longer queue behind an urgent arrival, so shorter.
  EXPECT_LT(GradlaneMessageNs(90 * kMillisecond, kTheta, 7),
            GradlaneMessageNs(90 * kMillisecond, kTheta, 2));
  // Never below θ (a message would be mostly overhead) nor above the iteration's traffic.
  EXPECT_EQ(GradlaneMessageNs(0, kTheta, 2), kTheta);
  EXPECT_EQ(GradlaneMessageNs(10 * kMicrosecond, kTheta, 2), kTheta);
  EXPECT_EQ(GradlaneMessageNs(400 * kMicrosecond, kTheta, 1), 70710);  // sqrt(400·50/4) µs
  // θ = 0 is taken as 1 µs, not as "messages are free".
  EXPECT_GT(GradlaneMessageNs(45 * kMillisecond, 0, 2), 0);
}

TEST(GradlaneRulesTest, MessageBytesFromRateAndTime) {
  EXPECT_EQ(GradlaneMessageBytes(1.25e9, kMillisecond), 1'250'000u);  // 10 Gbit/s, 1 ms
  EXPECT_EQ(GradlaneMessageBytes(125e6, kMillisecond), 125'000u);     // 1 Gbit/s, 1 ms
  EXPECT_EQ(GradlaneMessageBytes(1.25e9, kMillisecond) % kGradlaneSliceAlignBytes, 0u);
  EXPECT_EQ(GradlaneMessageBytes(1.0, 1), kGradlaneMinMessageBytes);
  // A starved first estimate (10 kB/s for a 5 MB iteration: N = 500 s) would ask for ~160 B
  // messages, whose per-message cost keeps the estimate starved: the floor holds a page.
  const TimeNs starved_n = 500 * kSecond;
  EXPECT_LT(1e4 * static_cast<double>(GradlaneMessageNs(starved_n, 3 * kMicrosecond, 2)) / 1e9,
            static_cast<double>(kGradlaneMinMessageBytes) / 8);
  EXPECT_EQ(GradlaneMessageBytes(1e4, GradlaneMessageNs(starved_n, 3 * kMicrosecond, 2)),
            kGradlaneMinMessageBytes);
  static_assert(kGradlaneMinMessageBytes % kGradlaneSliceAlignBytes == 0);
  // The message size grows with the rate (same time on the wire): the whole rule is in time.
  EXPECT_GT(GradlaneMessageBytes(1.25e9, GradlaneMessageNs(45 * kMillisecond, kTheta, 2)),
            GradlaneMessageBytes(375e6, GradlaneMessageNs(45 * kMillisecond, kTheta, 2)));
}

TEST(GradlaneRulesTest, WindowIsBandwidthDelayProductPlusTwoChargedMessagesPerPeerAndTwo) {
  const double b = 375e6;  // 3 Gbit/s
  const uint64_t msg = 500'000;
  const uint64_t theta_bytes = static_cast<uint64_t>(b * 50e-6);
  EXPECT_EQ(GradlaneChargeBytes(msg, b, kTheta), msg + theta_bytes);
  EXPECT_EQ(GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 2, 0),
            static_cast<uint64_t>(b * 100e-6) + 6 * (msg + theta_bytes));
  // A longer path: a larger window, by exactly the extra BDP.
  EXPECT_EQ(GradlaneCreditBytes(b, 1100 * kMicrosecond, msg, kTheta, 2, 0) -
                GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 2, 0),
            375'000u);
  // Each further peer sharing the receivers: two more messages.
  EXPECT_EQ(GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 7, 0) -
                GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 2, 0),
            10 * (msg + theta_bytes));
  // A run of 4 MiB to one receiver that P senders share drains at B/P: once this host has sent
  // it, (P - 1)/P of it is still queued there, and the window must hold that besides the
  // messages that keep the other receivers busy. One peer: no other sender, no term.
  constexpr uint64_t kRun = 4ull << 20;
  EXPECT_EQ(GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 7, kRun) -
                GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 7, 0),
            kRun / 7 * 6);
  EXPECT_EQ(GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 2, kRun) -
                GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 2, 0),
            kRun / 2);
  EXPECT_EQ(GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 1, kRun),
            GradlaneCreditBytes(b, 100 * kMicrosecond, msg, kTheta, 1, 0));
}

TEST(GradlaneRulesTest, FusionTakesEachPeersPrefixInPriorityOrder) {
  ReadyQueue q;
  // Priorities 0..7 alternating peers 1 and 2, 10 kB each, and a big one for peer 1 at 8.
  for (uint32_t i = 0; i < 8; ++i) q.Push(Seg(i, static_cast<Priority>(i), 1 + i % 2, 10'000));
  q.Push(Seg(8, 8, 1, 1'000'000));
  std::vector<Segment> scratch, block;
  const uint64_t bytes = GradlaneTakeBlock(q, 100'000, scratch, block);
  // Peer 1's slices 0, 2, 4, 6 fused; the big one does not fit and ends the block.
  ASSERT_EQ(block.size(), 4u);
  EXPECT_EQ(bytes, 40'000u);
  for (size_t k = 0; k < block.size(); ++k) {
    EXPECT_EQ(block[k].peer, 1);
    EXPECT_EQ(block[k].priority, static_cast<Priority>(2 * k));
  }
  // What was passed over is still queued, in priority order, ahead of the big segment.
  std::vector<Priority> rest;
  while (!q.empty()) rest.push_back(q.Pop().priority);
  EXPECT_EQ(rest, (std::vector<Priority>{1, 3, 5, 7, 8}));
}

TEST(GradlaneRulesTest, FusionStopsAtTheNextIteration) {
  ReadyQueue q;
  Segment a = Seg(0, 5, 1, 1000);
  Segment b = Seg(1, 0, 1, 1000);
  b.iteration = 1;
  q.Push(a);
  q.Push(b);
  std::vector<Segment> scratch, block;
  EXPECT_EQ(GradlaneTakeBlock(q, 1'000'000, scratch, block), 1000u);
  EXPECT_EQ(q.size(), 1u);
}

TEST(GradlaneRulesTest, FusionNeverSkipsASegmentOfTheSamePeer) {
  ReadyQueue q;
  q.Push(Seg(0, 0, 1, 10'000));
  q.Push(Seg(1, 1, 1, 90'000));  // does not fit in 50 kB
  q.Push(Seg(2, 2, 1, 1'000));   // would fit, but must not overtake priority 1
  std::vector<Segment> scratch, block;
  EXPECT_EQ(GradlaneTakeBlock(q, 50'000, scratch, block), 10'000u);
  ASSERT_EQ(block.size(), 1u);
  EXPECT_EQ(q.Top().priority, 1);
  // A head larger than the block is still taken, alone.
  block.clear();
  EXPECT_EQ(GradlaneTakeBlock(q, 50'000, scratch, block), 90'000u);
  EXPECT_EQ(block.size(), 1u);
}

TEST(GradlanePolicyTest, SmallTensorsQueuedBehindAFullWindowGoAsOneMessage) {
  auto p = Make(375e6);
  Dispatch d;
  // A large tensor fills the window first.
  p->OnReady(Range(1000, 1000, 1, 64ull << 20), 0);
  uint64_t in_flight = 0;
  while (p->NextDispatch(0, d)) in_flight += d.bytes;
  ASSERT_GT(in_flight, 0u);
  // 100 tiny gradients (4 kB) become ready meanwhile, more urgent than the big tensor.
  for (uint32_t i = 0; i < 100; ++i) p->OnReady(Range(i, static_cast<Priority>(i), 1, 4096), 0);
  EXPECT_FALSE(p->NextDispatch(0, d));
  p->OnAcked(in_flight, kMillisecond);
  ASSERT_TRUE(p->NextDispatch(kMillisecond, d));
  // All 100 in one message, in priority order.
  ASSERT_EQ(d.segments.size(), 100u);
  for (size_t k = 0; k < 100; ++k) EXPECT_EQ(d.segments[k].priority, static_cast<Priority>(k));
}

// Rule 4's admission: with a backlog of small tensors and room in the window for only part of
// a message, the policy waits for the room of a whole one rather than sending what fits (each
// such fragment would pay θ).
TEST(GradlanePolicyTest, ABacklogWaitsForRoomForAWholeMessage) {
  auto probe = Make(375e6);
  probe->OnReady(Range(1000, 1000, 1, 64ull << 20), 0);
  const uint64_t delta = probe->message_bytes();
  const uint64_t charge = GradlaneChargeBytes(delta, 375e6, kTheta);
  ASSERT_LT(delta, 800'000u) << "the backlog below must exceed one message";
  // A window of three and a half messages: three slices fit, half a message stays free.
  PolicyConfig c;
  c.name = "gradlane";
  c.initial_bandwidth_bytes_per_s = 375e6;
  c.per_message_overhead_ns = kTheta;
  c.credit_bytes = 3 * charge + charge / 2;
  auto p = GradlanePolicy::Create(c);
  p->OnReady(Range(1000, 1000, 1, 64ull << 20), 0);
  ASSERT_EQ(p->message_bytes(), delta);
  // The 4 MiB partitions go in equal slices of about δ (rule 2), each within the alignment of
  // 4 MiB / count.
  const uint64_t count = GradlaneSliceCount(kGradlaneDefaultKeyPartitionBytes, delta);
  const uint64_t slice = kGradlaneDefaultKeyPartitionBytes / count;
  ASSERT_LT(3 * GradlaneChargeBytes(slice + kGradlaneSliceAlignBytes, 375e6, kTheta),
            c.credit_bytes);
  ASSERT_GT(4 * GradlaneChargeBytes(slice - kGradlaneSliceAlignBytes, 375e6, kTheta),
            c.credit_bytes);
  Dispatch d;
  int sent = 0;
  uint64_t first = 0;
  while (p->NextDispatch(0, d)) {
    ASSERT_NEAR(static_cast<double>(d.bytes), static_cast<double>(slice), kGradlaneSliceAlignBytes);
    if (sent == 0) first = d.bytes;
    ++sent;
  }
  ASSERT_EQ(sent, 3);
  // 200 small gradients (4 kB, 800 kB in all), more urgent; half a message of room is free,
  // enough for several of them, not for a whole message.
  for (uint32_t i = 0; i < 200; ++i) p->OnReady(Range(i, static_cast<Priority>(i), 1, 4096), 0);
  ASSERT_GE(p->credit_capacity() - p->charged_in_use(),
            GradlaneChargeBytes(4 * 4096, 375e6, kTheta));
  EXPECT_FALSE(p->NextDispatch(0, d));
  EXPECT_EQ(p->NextWakeup(0), kNever) << "only an ack can make room";
  // One slice acknowledged: a whole message of small gradients goes, in priority order.
  p->OnAcked(first, kMillisecond);
  ASSERT_TRUE(p->NextDispatch(kMillisecond, d));
  EXPECT_EQ(d.bytes, delta - delta % 4096);
  EXPECT_EQ(d.segments.front().priority, 0);
  for (size_t k = 1; k < d.segments.size(); ++k) {
    EXPECT_EQ(d.segments[k].priority, d.segments[k - 1].priority + 1);
  }
}

// Every host follows the same priority order: with a tensor's slices sent partition by
// partition, all W - 1 workers would push to the same shard owner at once. Slice j of every
// partition goes before slice j + 1 of any (rule 2), for pushes to the owners and for a shard's
// pull responses to the workers alike.
TEST(GradlanePolicyTest, SlicesOfABigTensorGoRoundRobinOverItsOwners) {
  auto p = Make(1.25e9);
  constexpr uint64_t kPartition = kGradlaneDefaultKeyPartitionBytes;
  for (uint16_t owner = 1; owner <= 4; ++owner) {  // a 16 MiB tensor, one partition per owner
    ReadyRange r = Range(7, 2, owner, 4 * kPartition);
    r.offset = (owner - 1) * kPartition;
    r.length = kPartition;
    p->OnReady(r, 0);
  }
  ASSERT_LT(p->message_bytes(), kPartition / 2) << "several slices per partition";
  ASSERT_GE(p->queued_segments(), 8u);
  Dispatch d;
  std::vector<uint16_t> peers;
  while (peers.size() < 8 && p->NextDispatch(0, d)) {
    ASSERT_EQ(d.segments.size(), 1u) << "a slice is a message of its own";
    peers.push_back(d.segments[0].peer);
  }
  EXPECT_EQ(peers, (std::vector<uint16_t>{1, 2, 3, 4, 1, 2, 3, 4}));

  // A shard's pull responses of one partition: slice j to every worker before slice j + 1.
  auto shard = Make(1.25e9);
  for (uint16_t worker = 1; worker <= 3; ++worker) {
    ReadyRange r = Range(9, 0, worker, kPartition);
    r.direction = Direction::kPull;
    shard->OnReady(r, 0);
  }
  peers.clear();
  while (peers.size() < 6 && shard->NextDispatch(0, d)) peers.push_back(d.segments[0].peer);
  EXPECT_EQ(peers, (std::vector<uint16_t>{1, 2, 3, 1, 2, 3}));
}

// A ring all-reduce host forwards chunks of one tensor to its one neighbour, each a hop of a
// chain that waited for the hop before it: they go in the order they arrived, not in the
// order of their offsets in the tensor (rule 2), while priority still orders the tensors.
TEST(GradlanePolicyTest, RingHopsOfOneTensorGoInTheOrderTheyArrived) {
  auto p = Make(1.25e9);
  constexpr uint64_t kTensor = 8 << 20;  // two key partitions, four chunks of 2 MiB
  constexpr uint64_t kChunk = 2 << 20;
  auto hop = [&](uint32_t tensor, Priority priority, uint64_t chunk, Direction direction) {
    ReadyRange r = Range(tensor, priority, 1, kTensor);
    r.offset = chunk * kChunk;
    r.length = kChunk;
    r.direction = direction;
    r.ring_hop = true;
    return r;
  };
  // Chunk 3's reduce-scatter hop first, then chunk 0's all-gather, chunk 2's reduce-scatter,
  // and last a more urgent tensor's hop.
  p->OnReady(hop(5, 4, 3, Direction::kPush), 0);
  p->OnReady(hop(5, 4, 0, Direction::kPull), 10);
  p->OnReady(hop(5, 4, 2, Direction::kPush), 20);
  p->OnReady(hop(6, 1, 1, Direction::kPush), 30);
  ASSERT_LT(p->message_bytes(), kChunk / 2) << "several slices per chunk";
  std::vector<std::pair<uint32_t, uint64_t>> order;  // (tensor, chunk) of each new chunk sent
  Dispatch d;
  while (p->NextDispatch(0, d)) {
    for (const Segment& s : d.segments) {
      const std::pair<uint32_t, uint64_t> at{KeyTensor(s.key), s.offset / kChunk};
      if (order.empty() || order.back() != at) order.push_back(at);
    }
    p->OnAcked(d.bytes, 0);
  }
  const std::vector<std::pair<uint32_t, uint64_t>> want = {{6, 1}, {5, 3}, {5, 0}, {5, 2}};
  EXPECT_EQ(order, want);

  // The same ranges not marked as ring hops keep rule 2's order: by slice round, then offset.
  auto ps = Make(1.25e9);
  for (auto [chunk, direction] :
       {std::pair{uint64_t{3}, Direction::kPush}, std::pair{uint64_t{2}, Direction::kPush}}) {
    ReadyRange r = hop(5, 4, chunk, direction);
    r.ring_hop = false;
    ps->OnReady(r, 0);
  }
  ASSERT_TRUE(ps->NextDispatch(0, d));
  EXPECT_EQ(d.segments[0].offset, 2 * kChunk) << "chunk 2 (partition 1's first slice) first";
}

// Rule 2's slices: round(piece / δ) equal ones, so a piece a little over δ is one message
// rather than δ and a sliver that pays θ for a few bytes.
TEST(GradlaneRulesTest, APieceIsCutIntoTheNearestCountOfEqualSlices) {
  constexpr uint64_t kDelta = 60'000;
  EXPECT_EQ(GradlaneSliceCount(65'536, kDelta), 1u) << "just over δ: whole";
  EXPECT_EQ(GradlaneSliceCount(20'000, kDelta), 1u) << "under δ: whole";
  EXPECT_EQ(GradlaneSliceCount(89'992, kDelta), 1u) << "under 1½δ: whole";
  EXPECT_EQ(GradlaneSliceCount(90'000, kDelta), 2u) << "1½δ: two halves";
  EXPECT_EQ(GradlaneSliceStart(90'000, 2, 1), 45'000u);
  EXPECT_EQ(GradlaneSliceCount(4ull << 20, kDelta), 70u) << "70 slices, not 69 and a sliver";
  EXPECT_EQ(GradlaneSliceStart(4ull << 20, 70, 1), 59'912u) << "4 MiB / 70, aligned down";
  // Rounding every slice up to the alignment once left the last one a sliver: 512 slices of
  // 4,104 bytes and a last one of 10.
  EXPECT_EQ(GradlaneSliceCount(2'097'154, 4'096), 512u);
  EXPECT_GE(2'097'154 - GradlaneSliceStart(2'097'154, 512, 511), 4'096u - 8);
  // k·piece does not overflow: 2^33 slices of a 32 TiB piece.
  EXPECT_EQ(GradlaneSliceStart(uint64_t{1} << 45, uint64_t{1} << 33, (uint64_t{1} << 33) - 1),
            (uint64_t{1} << 45) - 4'096);
  for (uint64_t piece : {uint64_t{1}, uint64_t{4'096}, uint64_t{123'457}, uint64_t{2'097'154},
                         uint64_t{4} << 20, uint64_t{400} << 20}) {
    for (uint64_t delta : {uint64_t{4'096}, kDelta, uint64_t{1} << 20}) {
      const uint64_t count = GradlaneSliceCount(piece, delta);
      EXPECT_GE(count, 1u);
      EXPECT_EQ(GradlaneSliceStart(piece, count, 0), 0u);
      EXPECT_EQ(GradlaneSliceStart(piece, count, count), piece);
      if (count == 1) {
        EXPECT_LT(2 * piece, 3 * delta) << piece << " " << delta << ": whole only under 1½δ";
        continue;
      }
      uint64_t shortest = piece;
      uint64_t longest = 0;
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t begin = GradlaneSliceStart(piece, count, k);
        const uint64_t end = GradlaneSliceStart(piece, count, k + 1);
        if (k + 1 < count) {
          ASSERT_EQ(end % kGradlaneSliceAlignBytes, 0u) << piece << " " << k;
        }
        ASSERT_GT(end, begin) << piece << " " << delta << " " << k;
        shortest = std::min(shortest, end - begin);
        longest = std::max(longest, end - begin);
      }
      // Interior slices are piece / count ± the alignment, the last one up to it longer.
      EXPECT_LT(longest - shortest, 2 * kGradlaneSliceAlignBytes) << piece << " " << delta;
      EXPECT_GE(4 * shortest + 4 * kGradlaneSliceAlignBytes, 3 * delta) << piece << " " << delta;
      EXPECT_LE(4 * longest, 5 * delta + 4 * kGradlaneSliceAlignBytes) << piece << " " << delta;
    }
  }
}

// The daemon reduces and pulls a key partition once all of it has arrived, so round-robin over
// every partition of a 400 MB tensor would complete none of them before the whole tensor is
// through. Partitions go in groups of P + 1 (enough owners to spread over): within a group
// slice by slice, and the group before the next.
TEST(GradlaneRulesTest, RoundsInterleaveSlicesWithinGroupsOfPartitions) {
  constexpr uint32_t kGroup = 3;  // P = 2
  // Within a group: slice j of every partition before slice j + 1 of any.
  EXPECT_LT(GradlaneSliceRound(2, 0, kGroup), GradlaneSliceRound(0, 1, kGroup));
  EXPECT_EQ(GradlaneSliceRound(0, 4, kGroup), GradlaneSliceRound(2, 4, kGroup));
  // The next group only after every slice of this one.
  EXPECT_LT(GradlaneSliceRound(2, 4000, kGroup), GradlaneSliceRound(3, 0, kGroup));
  EXPECT_LT(GradlaneSliceRound(5, 9, kGroup), GradlaneSliceRound(6, 0, kGroup));
  EXPECT_EQ(GradlaneSliceRound(3, 7, kGroup), GradlaneSliceRound(5, 7, kGroup));
  // The slice index saturates instead of spilling into the group bits.
  EXPECT_LT(GradlaneSliceRound(0, uint64_t{1} << 40, kGroup), GradlaneSliceRound(3, 0, kGroup));
  EXPECT_EQ(GradlaneSliceRound(7, 1, 0), GradlaneSliceRound(7, 1, 1)) << "a group of at least 1";
}

// Under incast the rate estimate swings by 2x and more and the smoothed RTT carries the
// receivers' queues: neither may move the RTT floor up (the first version restarted it on every
// 2x swing and sized windows of tens of MB at W = 8).
TEST(GradlanePolicyTest, TheRttFloorIgnoresSwingsOfTheEstimate) {
  auto p = Make(125e6);
  p->OnLinkEstimate(125e6, 100 * kMicrosecond);
  for (uint32_t i = 0; i < 20; ++i)
    p->OnReady(Range(i, static_cast<Priority>(i), 1 + i % 7, 5'000'000), 0);
  const double swings[][2] = {{50e6, 80e-3}, {250e6, 240e-3}, {90e6, 60e-3}, {125e6, 150e-3}};
  for (const auto& [rate, rtt_s] : swings) {
    p->OnLinkEstimate(rate, static_cast<TimeNs>(rtt_s * kSecond));
    EXPECT_EQ(p->rtt_min(), 100 * kMicrosecond);
    EXPECT_EQ(p->credit_capacity(),
              GradlaneCreditBytes(p->bandwidth_bytes_per_s(), 100 * kMicrosecond,
                                  p->message_bytes(), kTheta, p->peers(),
                                  kGradlaneDefaultKeyPartitionBytes));
  }
  // A window of 2(P + 1) messages, one BDP and the run term, not the smoothed RTT's worth.
  EXPECT_LT(p->credit_capacity(), 125e6 * 0.060);
}

TEST(GradlanePolicyTest, WindowAndMessageFollowTheEstimate) {
  auto p = Make(1.25e9);
  p->OnLinkEstimate(1.25e9, 100 * kMicrosecond);
  // One iteration's worth of traffic so that N is known: 60 MB at 10 Gbit/s = 48 ms.
  for (uint32_t i = 0; i < 60; ++i) p->OnReady(Range(i, static_cast<Priority>(i), 1, 1'000'000), 0);
  const uint64_t msg_fast = p->message_bytes();
  const uint64_t window_fast = p->credit_capacity();
  const double n_fast = 60e6 / 1.25e9;
  // N is re-derived only when it moved by more than 1/8 (δ ∝ sqrt(N): within 6%).
  EXPECT_NEAR(static_cast<double>(msg_fast), 1.25e9 * std::sqrt(n_fast * 50e-6 / 4),
              0.07 * static_cast<double>(msg_fast));
  EXPECT_EQ(window_fast, GradlaneCreditBytes(1.25e9, 100 * kMicrosecond, msg_fast, kTheta, 1,
                                             kGradlaneDefaultKeyPartitionBytes));
  // A smaller RTT is taken (a floor), a larger smoothed one is not (it includes our own queue).
  p->OnLinkEstimate(1.25e9, 5 * kMillisecond);
  EXPECT_EQ(p->rtt_min(), 100 * kMicrosecond);
  EXPECT_EQ(p->credit_capacity(), window_fast);
}

// The rules' config at 3 Gbit/s and kTheta, as the outer loop builds its variants from.
PolicyConfig RulesAt375MBytesPerS() {
  PolicyConfig c;
  c.name = "gradlane-rules";
  c.initial_bandwidth_bytes_per_s = 375e6;
  c.per_message_overhead_ns = kTheta;
  return c;
}

// The outer loop's variants (gradlane_selector.h): the same rules with half and twice rule 4's
// window, re-derived with it as the estimates move; the message size is rule 1's either way. A
// window the user fixed is not scaled.
TEST(GradlanePolicyTest, WindowVariantsScaleTheDerivedWindowOnly) {
  PolicyConfig c = RulesAt375MBytesPerS();
  auto one = GradlanePolicy::Create(c);
  auto half = GradlanePolicy::Create(c, GradlaneVariant::kHalfWindow);
  auto twice = GradlanePolicy::Create(c, GradlaneVariant::kDoubleWindow);
  EXPECT_EQ(one->name(), "gradlane-rules");
  EXPECT_EQ(half->name(), "gradlane-rules-window/2");
  EXPECT_EQ(twice->name(), "gradlane-rules-window*2");
  for (auto* p : {one.get(), half.get(), twice.get()}) {
    p->OnLinkEstimate(375e6, 100 * kMicrosecond);
    for (uint32_t i = 0; i < 30; ++i)
      p->OnObservedReady(Range(i, static_cast<Priority>(i), 1 + i % 3, 1'000'000), 0);
  }
  const uint64_t rule = GradlaneCreditBytes(375e6, 100 * kMicrosecond, one->message_bytes(), kTheta,
                                            3, kGradlaneDefaultKeyPartitionBytes);
  EXPECT_EQ(one->credit_capacity(), rule);
  EXPECT_EQ(half->message_bytes(), one->message_bytes());
  EXPECT_EQ(twice->message_bytes(), one->message_bytes());
  EXPECT_EQ(half->credit_capacity(), rule / 2);
  EXPECT_EQ(twice->credit_capacity(), 2 * rule);
  // The link slows: each follows the rule at its own scale.
  for (auto* p : {one.get(), half.get(), twice.get()}) p->OnLinkEstimate(125e6, kMillisecond);
  EXPECT_LT(one->credit_capacity(), rule);
  EXPECT_EQ(half->credit_capacity(), one->credit_capacity() / 2);
  EXPECT_EQ(twice->credit_capacity(), 2 * one->credit_capacity());
  // Twice the window lets twice the bytes out before the first ack.
  auto sent_before_ack = [](GradlanePolicy& p) {
    for (uint32_t i = 0; i < 200; ++i)
      p.OnReady(Range(i, static_cast<Priority>(i), 1, 64000, 1), 0);
    Dispatch d;
    uint64_t sent = 0;
    while (p.NextDispatch(0, d)) sent += d.bytes;
    return sent;
  };
  const uint64_t sent_one = sent_before_ack(*one);
  const uint64_t sent_twice = sent_before_ack(*twice);
  EXPECT_GT(sent_twice, sent_one + sent_one / 2);
  EXPECT_LT(sent_before_ack(*half), sent_one * 3 / 4);
  c.credit_bytes = 1 << 20;
  EXPECT_EQ(GradlanePolicy::Create(c, GradlaneVariant::kHalfWindow)->credit_capacity(), 1u << 20);
  EXPECT_EQ(GradlanePolicy::Create(c, GradlaneVariant::kDoubleWindow)->credit_capacity(), 1u << 20);
}

// The third variant (gradlane_selector.h): blocks of up to twice δ. The slices, the window and
// the order are the rules'; a backlog of small tensors for one peer goes in half as many
// messages, each a prefix of that peer's queue in priority order.
TEST(GradlanePolicyTest, BlocksVariantFusesUpToTwiceTheMessage) {
  PolicyConfig c = RulesAt375MBytesPerS();
  auto one = GradlanePolicy::Create(c);
  auto blocks = GradlanePolicy::Create(c, GradlaneVariant::kDoubleBlocks);
  EXPECT_EQ(blocks->name(), "gradlane-rules-blocks*2");
  constexpr uint64_t kSmall = 3000;
  constexpr uint32_t kTensors = 400;
  struct Sent {
    std::vector<uint64_t> bytes;
    bool in_order = true;
  };
  auto drain = [&](GradlanePolicy& p) {
    p.OnLinkEstimate(375e6, 100 * kMicrosecond);
    for (uint32_t i = 0; i < kTensors; ++i)
      p.OnReady(Range(i, static_cast<Priority>(kTensors - i), 1, kSmall), 0);
    Sent sent;
    Priority last = 0;
    Dispatch d;
    for (int guard = 0; guard < 10'000 && p.queued_segments() > 0; ++guard) {
      if (!p.NextDispatch(0, d)) {
        p.OnAcked(p.credit_in_use(), 0);  // every ack at once: the window never binds here
        continue;
      }
      sent.bytes.push_back(d.bytes);
      for (const Segment& s : d.segments) {
        if (s.priority < last) sent.in_order = false;
        last = s.priority;
      }
    }
    return sent;
  };
  const Sent by_rules = drain(*one);
  const Sent by_blocks = drain(*blocks);
  ASSERT_EQ(blocks->message_bytes(), one->message_bytes()) << "rule 1 is the same";
  ASSERT_EQ(blocks->credit_capacity(), one->credit_capacity()) << "rule 4 is the same";
  const uint64_t delta = one->message_bytes();
  ASSERT_GT(delta, 4 * kSmall) << "the premise: several tensors fit in one message";
  EXPECT_TRUE(by_rules.in_order);
  EXPECT_TRUE(by_blocks.in_order);
  uint64_t total_rules = 0, total_blocks = 0;
  for (uint64_t b : by_rules.bytes) {
    EXPECT_LE(b, delta);
    total_rules += b;
  }
  for (uint64_t b : by_blocks.bytes) {
    EXPECT_LE(b, 2 * delta);
    total_blocks += b;
  }
  EXPECT_EQ(total_rules, kTensors * kSmall);
  EXPECT_EQ(total_blocks, kTensors * kSmall);
  // All but the last message of each are full to within one tensor.
  EXPECT_GT(by_blocks.bytes.front(), 2 * delta - kSmall);
  EXPECT_GT(by_rules.bytes.front(), delta - kSmall);
  EXPECT_LE(2 * by_blocks.bytes.size(), by_rules.bytes.size() + 2);
}

TEST(GradlanePolicyTest, AdaptsWhenTheBandwidthDropsMidRun) {
  auto p = Make(1.25e9);
  p->OnLinkEstimate(1.25e9, 100 * kMicrosecond);
  Dispatch d;
  TimeNs now = 0;
  auto iteration = [&](int64_t it) {
    for (uint32_t i = 0; i < 60; ++i) {
      p->OnReady(Range(i, static_cast<Priority>(i), 1 + i % 2, 1'000'000, it), now);
    }
    while (p->queued_segments() > 0) {
      uint64_t sent = 0;
      while (p->NextDispatch(now, d)) sent += d.bytes;
      now += kMillisecond;
      p->OnAcked(sent, now);
    }
  };
  iteration(0);
  iteration(1);
  const uint64_t msg_before = p->message_bytes();
  const uint64_t window_before = p->credit_capacity();
  // The link drops to 1 Gbit/s; its smoothed RTT grows to 300 µs, which does not move the
  // floor (TheRttFloorIgnoresSwingsOfTheEstimate).
  p->OnLinkEstimate(125e6, 300 * kMicrosecond);
  iteration(2);
  // N is 10x longer in time, B 10x smaller: δ = B·sqrt(N·θ) shrinks by 10/sqrt(10).
  EXPECT_NEAR(static_cast<double>(p->message_bytes()),
              static_cast<double>(msg_before) / std::sqrt(10.0), 0.05 * msg_before);
  EXPECT_EQ(p->rtt_min(), 100 * kMicrosecond);
  EXPECT_EQ(p->credit_capacity(),
            GradlaneCreditBytes(125e6, 100 * kMicrosecond, p->message_bytes(), kTheta, 2,
                                kGradlaneDefaultKeyPartitionBytes));
  EXPECT_LT(p->credit_capacity(), window_before);
  // And back up: the window and the message grow again.
  p->OnLinkEstimate(1.25e9, 100 * kMicrosecond);
  EXPECT_EQ(p->message_bytes(), msg_before);
  EXPECT_EQ(p->credit_capacity(), window_before);
}

}  // namespace
}  // namespace gradlane::sched
