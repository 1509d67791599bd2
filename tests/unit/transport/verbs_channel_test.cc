// The verbs protocol core (transport/verbs/verbs_channel.h) against the in-memory NIC: eager and
// rendezvous segments arrive bit-exact and complete in order, credits are the posted receives
// (never an RNR), refusals and error completions fail sends in order, and a peer that breaks the
// protocol fails the channel rather than corrupting memory. Both ends count into one set of
// VerbsCounters, as in a transport: each step, stall, reply and completion lands in its counter.
#include "transport/verbs/verbs_channel.h"

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fakes/fake_verbs.h"

namespace gradlane::transport::verbs {
namespace {

using fake::FakeNic;
using fake::FakeQueuePair;

struct SenderLog : SenderEvents {
  std::vector<uint64_t> acked;
  std::vector<std::pair<uint64_t, absl::StatusCode>> failed;
  int downs = 0;
  absl::Status down_status;
  void OnSendAcked_st(uint64_t cookie) override { acked.push_back(cookie); }
  void OnSendFailed_st(uint64_t cookie, const absl::Status& why) override {
    failed.push_back({cookie, why.code()});
  }
  void OnChannelDown_st(const absl::Status& why) override {
    ++downs;
    down_status = why;
  }
};

// Places segment i (its FrameHeader::offset) at destination[offset]; refuses keys in `refuse`.
struct ReceiverLog : ReceiverEvents {
  uint8_t* destination = nullptr;
  uint32_t destination_rkey = 0;
  std::vector<uint64_t> refuse_keys;
  std::vector<uint64_t> placed_keys;
  bool cpu_writable = true;  // false: the destination stands for GPU memory
  int downs = 0;
  absl::Status down_status;
  SegmentTarget ResolveSegment_st(const FrameHeader& h) override {
    for (uint64_t k : refuse_keys) {
      if (k == h.key) return SegmentTarget{};
    }
    SegmentTarget t;
    t.accept = true;
    t.local = destination + h.offset;
    t.remote_addr = reinterpret_cast<uint64_t>(destination + h.offset);
    t.rkey = destination_rkey;
    t.cookie = h.key;
    t.cpu_writable = cpu_writable;
    return t;
  }
  void OnSegmentPlaced_st(const FrameHeader& h, const SegmentTarget& t) override {
    EXPECT_EQ(t.cookie, h.key);
    placed_keys.push_back(h.key);
  }
  void OnChannelDown_st(const absl::Status& why) override {
    ++downs;
    down_status = why;
  }
};

// One connection: a sender's queue pair joined to a receiver's, their memory, and the source
// and destination buffers of `bytes` each.
class Link {
 public:
  // `start`: the receiver posts its receives and writes its first credit word at once (as the
  // tests below but the set-up ones want).
  Link(ChannelLimits limits, size_t bytes, bool start = true)
      : limits_(limits),
        source_(bytes),
        destination_(bytes, 0),
        reply_region_(ReplyRegionBytes(limits.reply_entries), 0),
        headers_(size_t{limits.reply_entries} * kFrameHeaderBytes),
        slots_(size_t{limits.recv_slots} * limits.slot_bytes),
        staging_(size_t{limits.send_queue_depth} * kReplyEntryBytes) {
    std::mt19937 rng(bytes);
    for (uint8_t& b : source_) b = static_cast<uint8_t>(rng());
    auto [s, r] = nic_.ConnectedPair();
    sender_qp_ = s;
    receiver_qp_ = r;
    source_keys_ = nic_.Register(source_.data(), source_.size(), false);
    const fake::MemoryKeys dest = nic_.Register(destination_.data(), destination_.size(), true);
    const fake::MemoryKeys reply = nic_.Register(reply_region_.data(), reply_region_.size(), true);
    const fake::MemoryKeys headers = nic_.Register(headers_.data(), headers_.size(), false);
    const fake::MemoryKeys slots = nic_.Register(slots_.data(), slots_.size(), false);
    const fake::MemoryKeys staging = nic_.Register(staging_.data(), staging_.size(), false);
    receiver_log_.destination = destination_.data();
    receiver_log_.destination_rkey = dest.rkey;
    sender_ = std::make_unique<VerbsSender>(
        *sender_qp_, limits, SenderMemory{reply_region_.data(), headers_.data(), headers.lkey},
        sender_log_, &counters_, &sender_peer_);
    receiver_ = std::make_unique<VerbsReceiver>(
        *receiver_qp_, limits,
        ReceiverMemory{slots_.data(), slots.lkey, staging_.data(), staging.lkey,
                       reinterpret_cast<uint64_t>(reply_region_.data()), reply.rkey},
        receiver_log_, &counters_, &receiver_peer_);
    if (start) {
      EXPECT_TRUE(receiver_->Start_st().ok());
    }
  }

  absl::Status Post(uint64_t key, uint64_t offset, uint64_t length, uint16_t flags = 0) {
    OutgoingSegment s;
    s.header = MakeHeader(FrameType::kData, 7, 1);
    s.header.flags = flags;
    s.header.key = key;
    s.header.offset = offset;
    s.header.length = length;
    s.header.payload_bytes = static_cast<uint32_t>(length);
    s.payload_addr = reinterpret_cast<uint64_t>(source_.data() + offset);
    s.payload_lkey = source_keys_.lkey;
    s.cookie = key;
    return sender_->Post(s);
  }

  // One round of everything: the NIC runs `steps` requests, each side handles its completions,
  // the receiver flushes its replies, the sender reads them. Returns whether anything moved.
  bool Round(int steps = 1 << 30) {
    int moved = nic_.Run(steps);
    for (const Completion& c : receiver_qp_->TakeCompletions()) {
      receiver_->OnCompletion_st(c);
      ++moved;
    }
    moved += receiver_->Flush_st();
    for (const Completion& c : sender_qp_->TakeCompletions()) {
      sender_->OnCompletion_st(c);
      ++moved;
    }
    moved += sender_->Progress_st();
    return moved > 0;
  }
  // The sender's queue pair is ready to receive now, and the receiver is told so.
  void PeerReadyAndSettle() {
    sender_qp_->SetReadyToReceive(true);
    receiver_->PeerReady_st();
    Settle();
  }
  void Settle(int steps_per_round = 1 << 30) {
    for (int i = 0; i < 100000 && Round(steps_per_round); ++i) {
    }
  }

  bool SameBytes(uint64_t offset, uint64_t length) const {
    return std::memcmp(source_.data() + offset, destination_.data() + offset, length) == 0;
  }

  ChannelLimits limits_;
  FakeNic nic_;
  FakeQueuePair* sender_qp_ = nullptr;
  FakeQueuePair* receiver_qp_ = nullptr;
  std::vector<uint8_t> source_, destination_, reply_region_, headers_, slots_, staging_;
  fake::MemoryKeys source_keys_;
  SenderLog sender_log_;
  ReceiverLog receiver_log_;
  VerbsCounters counters_;  // before the channels, which count into it until destroyed
  // The connection's per-peer figures, as each end counts them (`gradlanectl peers`).
  PeerCounters sender_peer_, receiver_peer_;
  std::unique_ptr<VerbsSender> sender_;
  std::unique_ptr<VerbsReceiver> receiver_;
};

ChannelLimits SmallLimits() {
  ChannelLimits l;
  l.recv_slots = 4;
  l.slot_bytes = kFrameHeaderBytes + 256;  // eager up to 256 bytes
  l.reply_entries = 16;
  l.send_queue_depth = 8;
  l.signal_every = 4;
  return l;
}

// The hazard of connection set-up: the receiver's queue pair is ready before the sender's (the
// sender moves its own only once the receiver's answer reaches it). A credit word written before
// then is dropped and, once RC's retries run out, fails the connection.
TEST(VerbsChannelTest, ACreditWordWrittenBeforeTheSenderIsReadyFailsTheConnection) {
  Link link(SmallLimits(), 4096, /*start=*/false);
  link.sender_qp_->SetReadyToReceive(false);
  ASSERT_TRUE(link.receiver_->Start_st().ok());
  link.Settle();
  EXPECT_EQ(link.receiver_log_.downs, 1);
  EXPECT_EQ(link.counters_.retry_exceeded_errors.Get(), 1u);
  EXPECT_EQ(link.sender_->credits(), 0u);
}

// What the transport does instead: the receiver posts its receives but holds every write until
// it is told the sender's queue pair is ready; then the credits go out and segments flow.
TEST(VerbsChannelTest, HeldWritesWaitUntilTheSenderIsReady) {
  Link link(SmallLimits(), 4096, /*start=*/false);
  link.sender_qp_->SetReadyToReceive(false);
  ASSERT_TRUE(link.receiver_->Start_st(/*hold_writes=*/true).ok());
  EXPECT_EQ(link.receiver_qp_->posted_receives(), 4u);
  ASSERT_TRUE(link.Post(1, 0, 100).ok());     // eager
  ASSERT_TRUE(link.Post(2, 100, 3000).ok());  // rendezvous
  for (int i = 0; i < 10; ++i) link.Round();
  EXPECT_EQ(link.receiver_qp_->send_requests(), 0u);  // nothing written to the sender
  EXPECT_EQ(link.sender_->credits(), 0u);
  EXPECT_EQ(link.sender_->pending(), 2u);
  EXPECT_EQ(link.receiver_log_.downs, 0);
  EXPECT_EQ(link.sender_log_.downs, 0);
  link.PeerReadyAndSettle();
  EXPECT_EQ(link.sender_log_.acked, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(link.SameBytes(0, 3100));
  EXPECT_EQ(link.receiver_log_.downs, 0);
  EXPECT_EQ(link.sender_log_.downs, 0);
  EXPECT_EQ(link.nic_.rnr_errors(), 0u);
  EXPECT_EQ(link.counters_.retry_exceeded_errors.Get(), 0u);
  // Once released, PeerReady_st again changes nothing.
  link.receiver_->PeerReady_st();
  EXPECT_EQ(link.receiver_log_.downs, 0);
}

// What VerbsTransport's liveness check reads (a sender awaiting its peer, its progress mark, a
// write still out): a peer daemon that never answers leaves the mark still and no write out,
// so the check can fire; once the peer clears the segment, the write it allows is progress
// until the NIC completes it.
TEST(VerbsChannelTest, LivenessInputsTellASilentPeerFromASlowWrite) {
  Link link(SmallLimits(), 4096);
  ASSERT_TRUE(link.Post(1, 0, 3000).ok());  // rendezvous
  EXPECT_TRUE(link.sender_->AwaitingPeer());
  EXPECT_FALSE(link.sender_->WriteOutstanding());
  // The peer's daemon does nothing: its NIC takes the header, no reply ever comes.
  auto sender_round = [&] {
    link.nic_.Run();
    for (const Completion& c : link.sender_qp_->TakeCompletions()) link.sender_->OnCompletion_st(c);
    link.sender_->Progress_st();
  };
  sender_round();
  const uint64_t mark = link.sender_->progress_mark();
  for (int i = 0; i < 20; ++i) sender_round();
  EXPECT_EQ(link.sender_->progress_mark(), mark);
  EXPECT_TRUE(link.sender_->AwaitingPeer());
  EXPECT_FALSE(link.sender_->WriteOutstanding());
  // The peer answers (clear-to-send): the sender posts its write, which is out until the NIC
  // has run it and its completion is read.
  for (const Completion& c : link.receiver_qp_->TakeCompletions())
    link.receiver_->OnCompletion_st(c);
  link.receiver_->Flush_st();
  link.nic_.Run(1);  // the reply lands in the sender's reply region
  link.sender_->Progress_st();
  EXPECT_GT(link.sender_->progress_mark(), mark);
  EXPECT_TRUE(link.sender_->WriteOutstanding());
  link.Settle();
  EXPECT_FALSE(link.sender_->WriteOutstanding());
  EXPECT_FALSE(link.sender_->AwaitingPeer());
  EXPECT_EQ(link.sender_log_.acked, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(link.SameBytes(0, 3000));
}

TEST(VerbsChannelTest, LimitsAreValidated) {
  EXPECT_TRUE(SmallLimits().Validate().ok());
  ChannelLimits l = SmallLimits();
  l.reply_entries = 12;
  EXPECT_FALSE(l.Validate().ok());
  l = SmallLimits();
  l.signal_every = 5;  // above depth / 2: room might never come back
  EXPECT_FALSE(l.Validate().ok());
  l = SmallLimits();
  l.slot_bytes = 32;
  EXPECT_FALSE(l.Validate().ok());
}

TEST(VerbsChannelTest, EagerAndRendezvousSegmentsArriveBitExactAndCompleteInOrder) {
  Link link(SmallLimits(), 1 << 20);
  // Sizes around the eager limit (256), empty, and large; contiguous in the buffers.
  const std::vector<uint64_t> sizes = {0, 1, 255, 256, 257, 4096, 100000, 8, 256, 300000, 3};
  std::vector<std::pair<uint64_t, uint64_t>> posted;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(link.Post(i, offset, sizes[i]).ok());
    posted.push_back({offset, sizes[i]});
    offset += sizes[i];
    link.Round(1);  // interleave posting with the NIC's progress
  }
  link.Settle();
  std::vector<uint64_t> expected(sizes.size());
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(link.sender_log_.acked, expected);
  EXPECT_EQ(link.receiver_log_.placed_keys.size(), sizes.size());
  for (auto [o, n] : posted) EXPECT_TRUE(link.SameBytes(o, n)) << "at " << o;
  EXPECT_EQ(link.sender_->eager_sent(), 7u);       // 0, 1, 255, 256, 8, 256, 3
  EXPECT_EQ(link.sender_->rendezvous_sent(), 4u);  // 257, 4096, 100000, 300000
  EXPECT_EQ(link.nic_.rnr_errors(), 0u);
  EXPECT_EQ(link.sender_log_.downs, 0);
  EXPECT_EQ(link.sender_->pending(), 0u);
}

// GPUDirect: a segment whose target is GPU memory comes by rendezvous whatever its size (the
// receiver cannot copy into it), and one that comes eagerly anyway fails the connection rather
// than letting the CPU write through the NIC's address.
TEST(VerbsChannelTest, SegmentsFlaggedRendezvousGoByWriteWhateverTheirSize) {
  Link link(SmallLimits(), 1 << 16);
  link.receiver_log_.cpu_writable = false;
  const std::vector<uint64_t> sizes = {1, 255, 8, 256, 3, 4096};
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(link.Post(i, offset, sizes[i], kFlagRendezvous).ok());
    offset += sizes[i];
  }
  link.Settle();
  EXPECT_EQ(link.sender_log_.acked.size(), sizes.size());
  EXPECT_TRUE(link.SameBytes(0, offset));
  EXPECT_EQ(link.sender_->eager_sent(), 0u);
  EXPECT_EQ(link.sender_->rendezvous_sent(), sizes.size());
  EXPECT_EQ(link.receiver_log_.downs, 0);
  EXPECT_EQ(link.nic_.rnr_errors(), 0u);
}

TEST(VerbsChannelTest, AnEagerSegmentForGpuMemoryFailsTheReceiver) {
  Link link(SmallLimits(), 4096);
  link.receiver_log_.cpu_writable = false;
  ASSERT_TRUE(link.Post(1, 0, 8).ok());  // no kFlagRendezvous: eager
  link.Settle();
  EXPECT_EQ(link.receiver_log_.downs, 1);
  EXPECT_NE(link.receiver_log_.down_status.message().find("GPU memory"), std::string::npos)
      << link.receiver_log_.down_status;
  EXPECT_TRUE(link.receiver_log_.placed_keys.empty());
  EXPECT_EQ(link.destination_[0], 0);
}

TEST(VerbsChannelTest, CreditsAreThePostedReceivesNeverAnRnr) {
  // Four receive slots, sixteen segments outstanding at once, the NIC running one request at a
  // time: the sender waits for credits instead of overrunning the receiver.
  Link link(SmallLimits(), 1 << 20);
  std::mt19937 rng(5);
  uint64_t offset = 0;
  std::vector<std::pair<uint64_t, uint64_t>> posted;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 16; ++i) {
      const uint64_t n = rng() % 2 ? rng() % 256 : 257 + rng() % 20000;
      if (offset + n > (1u << 20)) offset = 0;
      const absl::Status s = link.Post(posted.size(), offset, n);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);  // reply ring full
        break;
      }
      posted.push_back({offset, n});
      offset += n;
    }
    link.Settle(1);
    ASSERT_EQ(link.sender_->pending(), 0u);
  }
  EXPECT_EQ(link.sender_log_.acked.size(), posted.size());
  EXPECT_EQ(link.nic_.rnr_errors(), 0u);
  EXPECT_GT(posted.size(), 200u);
}

TEST(VerbsChannelTest, SignalsOneRequestInNAndEveryWrite) {
  Link link(SmallLimits(), 1 << 20);
  for (int batch = 0; batch < 5; ++batch) {
    for (int i = 0; i < 8; ++i)
      ASSERT_TRUE(link.Post(batch * 8 + i, (batch * 8 + i) * 16, 16).ok());
    link.Settle();
  }
  // 40 eager SENDs, one signaled in four.
  EXPECT_EQ(link.sender_qp_->send_requests(), 40u);
  EXPECT_EQ(link.sender_qp_->signaled_requests(), 10u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(link.Post(100 + i, 4096 * (i + 1), 1000).ok());
  link.Settle();
  // Four headers (one of them the 4th-in-N) and four writes, each write signaled.
  EXPECT_EQ(link.sender_qp_->send_requests(), 48u);
  EXPECT_GE(link.sender_qp_->signaled_requests(), 14u);
  EXPECT_EQ(link.sender_log_.acked.size(), 44u);
}

TEST(VerbsChannelTest, RefusedSegmentsFailInOrderAndTheRestArrive) {
  Link link(SmallLimits(), 1 << 20);
  link.receiver_log_.refuse_keys = {1, 3};
  ASSERT_TRUE(link.Post(0, 0, 100).ok());      // eager
  ASSERT_TRUE(link.Post(1, 100, 5000).ok());   // rendezvous, refused: never written
  ASSERT_TRUE(link.Post(2, 5100, 5000).ok());  // rendezvous
  ASSERT_TRUE(link.Post(3, 10100, 10).ok());   // eager, refused
  ASSERT_TRUE(link.Post(4, 10110, 10).ok());
  link.Settle();
  EXPECT_EQ(link.sender_log_.acked, (std::vector<uint64_t>{0, 2, 4}));
  ASSERT_EQ(link.sender_log_.failed.size(), 2u);
  EXPECT_EQ(link.sender_log_.failed[0].first, 1u);
  EXPECT_EQ(link.sender_log_.failed[1].first, 3u);
  EXPECT_EQ(link.sender_log_.failed[0].second, absl::StatusCode::kNotFound);
  EXPECT_TRUE(link.SameBytes(5100, 5000));
  // The refused ranges were never touched.
  EXPECT_TRUE(std::all_of(link.destination_.begin() + 100, link.destination_.begin() + 5100,
                          [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(link.receiver_->refused(), 2u);
  EXPECT_EQ(link.sender_log_.downs, 0);
}

TEST(VerbsChannelTest, AnErrorCompletionFailsEveryPendingSendInOrderThenDownOnce) {
  Link link(SmallLimits(), 1 << 20);
  ASSERT_TRUE(link.Post(0, 0, 64).ok());
  link.Settle();
  ASSERT_EQ(link.sender_log_.acked.size(), 1u);
  // The next request fails (a retry-exceeded: the peer vanished), the rest are flushed.
  link.sender_qp_->FailNextSend(CompletionStatus::kRetryExceeded);
  for (uint64_t i = 1; i <= 6; ++i) ASSERT_TRUE(link.Post(i, i * 1000, i % 2 ? 100 : 3000).ok());
  link.Settle();
  EXPECT_EQ(link.sender_log_.downs, 1);
  EXPECT_EQ(link.sender_log_.down_status.code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(link.sender_log_.failed.size(), 6u);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(link.sender_log_.failed[i].first, i + 1);
  EXPECT_EQ(link.receiver_log_.downs, 1);  // its receives were flushed
  EXPECT_FALSE(link.Post(9, 0, 10).ok());
  EXPECT_TRUE(link.sender_->failed());
}

TEST(VerbsChannelTest, AClearToSendToMemoryNotRegisteredFailsTheChannel) {
  Link link(SmallLimits(), 1 << 20);
  link.receiver_log_.destination_rkey = 0xdead;  // a buggy receiver's key
  ASSERT_TRUE(link.Post(0, 0, 4000).ok());
  ASSERT_TRUE(link.Post(1, 4000, 10).ok());
  link.Settle();
  EXPECT_EQ(link.sender_log_.downs, 1);
  EXPECT_EQ(link.sender_log_.acked.size(), 0u);  // in order: 1 waits for 0, which failed
  EXPECT_EQ(link.sender_log_.failed.size(), 2u);
}

TEST(VerbsChannelTest, AReplyThatAnswersNothingFailsTheSender) {
  Link link(SmallLimits(), 1 << 20);
  ASSERT_TRUE(link.Post(0, 0, 100).ok());  // eager: its answer must be kAck or kRefuse
  // Run everything but the sender's reading of replies until the receiver's reply has landed.
  auto reply_landed = [&] {
    uint32_t stamp;
    std::memcpy(&stamp, link.reply_region_.data() + offsetof(ReplyEntry, stamp), 4);
    return stamp == 1;
  };
  for (int i = 0; i < 10 && !reply_landed(); ++i) {
    if (i > 0) link.sender_->Progress_st();  // picks up the first credits, posts the SEND
    link.nic_.Run();
    for (const Completion& c : link.receiver_qp_->TakeCompletions()) {
      link.receiver_->OnCompletion_st(c);
    }
    link.receiver_->Flush_st();
    link.nic_.Run();
  }
  ASSERT_TRUE(reply_landed());
  ASSERT_EQ(link.sender_log_.acked.size(), 0u);
  // Corrupt it: a clear-to-send for an eager segment.
  link.reply_region_[offsetof(ReplyEntry, kind)] = static_cast<uint8_t>(ReplyKind::kClearToSend);
  link.sender_->Progress_st();
  EXPECT_EQ(link.sender_log_.downs, 1);
  EXPECT_EQ(link.sender_log_.down_status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(link.sender_log_.failed.size(), 1u);
}

TEST(VerbsChannelTest, AMalformedHeaderFailsTheReceiver) {
  Link link(SmallLimits(), 1 << 20);
  OutgoingSegment s;
  s.header = MakeHeader(FrameType::kData, 7, 1);
  s.header.magic = 0x12345678;  // not a gradlane frame
  s.header.length = 10;
  s.header.payload_bytes = 10;
  s.payload_addr = reinterpret_cast<uint64_t>(link.source_.data());
  s.payload_lkey = link.source_keys_.lkey;
  ASSERT_TRUE(link.sender_->Post(s).ok());
  link.Settle();
  EXPECT_EQ(link.receiver_log_.downs, 1);
  EXPECT_EQ(link.receiver_log_.down_status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(link.receiver_log_.placed_keys.empty());
}

TEST(VerbsChannelTest, BackPressureWhenTheReplyRingIsFullThenRecovers) {
  Link link(SmallLimits(), 1 << 20);
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(link.Post(i, i * 10, 10).ok());
  EXPECT_EQ(link.Post(16, 160, 10).code(), absl::StatusCode::kResourceExhausted);
  link.Settle();
  EXPECT_EQ(link.sender_log_.acked.size(), 16u);
  EXPECT_TRUE(link.Post(16, 160, 10).ok());
  link.Settle();
  EXPECT_EQ(link.sender_log_.acked.size(), 17u);
  EXPECT_EQ(link.Post(17, 0, (256ull << 20) + 1).code(), absl::StatusCode::kInvalidArgument);
}

VerbsStats Snapshot(const VerbsCounters& c) {
  VerbsStats s;
  c.SnapshotInto(s);
  return s;
}

TEST(VerbsChannelCountersTest, EagerAndRendezvousStepsAreCountedEachOnce) {
  Link link(SmallLimits(), 1 << 20);
  link.Settle();  // the receiver's first credit word
  VerbsStats v = Snapshot(link.counters_);
  EXPECT_EQ(v.queue_pairs, 2u);
  EXPECT_EQ(v.receives_posted, 4u);
  EXPECT_EQ(v.credit_writes, 1u);
  EXPECT_EQ(v.credits_available, 4u);
  // Eager up to 256 bytes, rendezvous above.
  const std::vector<uint64_t> sizes = {0, 1, 256, 257, 4096, 100, 300000};
  uint64_t offset = 0, eager_bytes = 0, rendezvous_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(link.Post(i, offset, sizes[i]).ok());
    offset += sizes[i];
    (sizes[i] <= 256 ? eager_bytes : rendezvous_bytes) += sizes[i];
    link.Round(1);
  }
  link.Settle();
  ASSERT_EQ(link.sender_log_.acked.size(), sizes.size());
  v = Snapshot(link.counters_);
  EXPECT_EQ(v.eager_sends, 4u);
  EXPECT_EQ(v.eager_bytes, eager_bytes);
  EXPECT_EQ(v.rendezvous_headers, 3u);
  EXPECT_EQ(v.clear_to_send, 3u);
  EXPECT_EQ(v.rendezvous_writes, 3u);
  EXPECT_EQ(v.rendezvous_bytes, rendezvous_bytes);
  EXPECT_EQ(v.segments_acked, 7u);
  EXPECT_EQ(v.segments_failed, 0u);
  EXPECT_EQ(v.eager_received, 4u);
  EXPECT_EQ(v.eager_recv_bytes, eager_bytes);
  EXPECT_EQ(v.rendezvous_received, 3u);
  EXPECT_EQ(v.rendezvous_recv_bytes, rendezvous_bytes);
  EXPECT_EQ(v.segments_refused, 0u);
  // Every SEND and write with immediate consumed a receive, and each was posted again.
  EXPECT_EQ(v.receives_posted, 4u + 7u + 3u);
  EXPECT_EQ(v.replies_written, 7u);  // four acks, three clear-to-sends
  EXPECT_GE(v.credit_writes, 2u);
  EXPECT_EQ(v.credits_available, 4u);  // all receives posted again, none used
  // Completions: a receive per SEND (7) and per write with immediate (3), plus one per signaled
  // send-queue request of either end.
  EXPECT_EQ(v.completions,
            10u + link.sender_qp_->signaled_requests() + link.receiver_qp_->signaled_requests());
  EXPECT_EQ(v.flushed_completions + v.remote_access_errors + v.rnr_errors +
                v.retry_exceeded_errors + v.local_errors,
            0u);
  EXPECT_EQ(v.channel_failures, 0u);
  // Per peer: each segment is one frame and its payload bytes, sent by one end and received by
  // the other (a rendezvous segment's frame is its header, its bytes the write's), and one ack.
  const PeerStats out = link.sender_peer_.Snapshot();
  const PeerStats in = link.receiver_peer_.Snapshot();
  EXPECT_EQ(out.frames_sent, 7u);
  EXPECT_EQ(out.bytes_sent, eager_bytes + rendezvous_bytes);
  EXPECT_EQ(out.acks_received, 7u);
  EXPECT_EQ(out.sends_failed, 0u);
  EXPECT_EQ(out.frames_received + out.bytes_received, 0u);
  EXPECT_EQ(in.frames_received, 7u);
  EXPECT_EQ(in.bytes_received, eager_bytes + rendezvous_bytes);
  EXPECT_EQ(in.frames_sent + in.bytes_sent + in.acks_received + in.sends_failed, 0u);
  // And the two ends together are what the transport's totals make of the data-path counters.
  const PeerStats totals = DataPathPeerStats(v);
  for (const CounterInfo<PeerStats>& c : kPeerCounters) {
    EXPECT_EQ(out.*c.field + in.*c.field, totals.*c.field) << c.name;
  }
  // The channels take their queue pairs and credits out of the gauges when they go.
  link.sender_.reset();
  link.receiver_.reset();
  v = Snapshot(link.counters_);
  EXPECT_EQ(v.queue_pairs, 0u);
  EXPECT_EQ(v.credits_available, 0u);
}

TEST(VerbsChannelCountersTest, ACreditStallIsCountedOncePerStallNotPerRound) {
  Link link(SmallLimits(), 1 << 20);
  link.Settle();
  ASSERT_EQ(Snapshot(link.counters_).credits_available, 4u);
  // Four receive slots: the first four SENDs take every credit, the fifth and sixth wait.
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(link.Post(i, i * 100, 100).ok());
  VerbsStats v = Snapshot(link.counters_);
  EXPECT_EQ(v.eager_sends, 4u);
  EXPECT_EQ(v.credit_stalls, 1u);
  // Still no credit after more rounds in which nothing reached the receiver: the same stall.
  for (int i = 0; i < 5; ++i) link.sender_->Progress_st();
  EXPECT_EQ(Snapshot(link.counters_).credit_stalls, 1u);
  link.Settle();
  v = Snapshot(link.counters_);
  EXPECT_EQ(link.sender_log_.acked.size(), 6u);
  EXPECT_EQ(v.eager_sends, 6u);
  EXPECT_GE(v.credit_stalls, 1u);
  EXPECT_LE(v.credit_stalls, 2u);
  EXPECT_EQ(v.rnr_errors, 0u);
  // With credits back, a lone segment goes at once: no stall.
  const uint64_t stalls = v.credit_stalls;
  ASSERT_TRUE(link.Post(6, 600, 10).ok());
  EXPECT_EQ(Snapshot(link.counters_).credit_stalls, stalls);
}

TEST(VerbsChannelCountersTest, ErrorAndFlushCompletionsAndRefusalsAreCounted) {
  {
    Link link(SmallLimits(), 1 << 20);
    link.receiver_log_.refuse_keys = {1, 3};
    ASSERT_TRUE(link.Post(0, 0, 100).ok());
    ASSERT_TRUE(link.Post(1, 100, 5000).ok());  // rendezvous, refused: no write
    ASSERT_TRUE(link.Post(2, 5100, 5000).ok());
    ASSERT_TRUE(link.Post(3, 10100, 10).ok());  // eager, refused
    link.Settle();
    const VerbsStats v = Snapshot(link.counters_);
    EXPECT_EQ(v.segments_refused, 2u);
    EXPECT_EQ(v.segments_failed, 2u);
    EXPECT_EQ(v.segments_acked, 2u);
    EXPECT_EQ(v.clear_to_send, 1u);
    EXPECT_EQ(v.rendezvous_writes, 1u);
    EXPECT_EQ(v.replies_written, 4u);
    EXPECT_EQ(v.channel_failures, 0u);
    // Per peer: four frames each way, the refused ones failed sends; only the placed bytes
    // (100 eager, 5000 written) were sent and received.
    const PeerStats out = link.sender_peer_.Snapshot();
    const PeerStats in = link.receiver_peer_.Snapshot();
    EXPECT_EQ(out.frames_sent, 4u);
    EXPECT_EQ(out.acks_received, 2u);
    EXPECT_EQ(out.sends_failed, 2u);
    EXPECT_EQ(out.bytes_sent, 100u + 10u + 5000u) << "eager payloads go with their header";
    EXPECT_EQ(in.frames_received, 4u);
    EXPECT_EQ(in.bytes_received, 100u + 5000u);
  }
  {
    Link link(SmallLimits(), 1 << 20);
    ASSERT_TRUE(link.Post(0, 0, 64).ok());
    link.Settle();
    link.sender_qp_->FailNextSend(CompletionStatus::kRetryExceeded);
    for (uint64_t i = 1; i <= 6; ++i) ASSERT_TRUE(link.Post(i, i * 1000, i % 2 ? 100 : 3000).ok());
    link.Settle();
    ASSERT_EQ(link.sender_log_.downs, 1);
    const VerbsStats v = Snapshot(link.counters_);
    EXPECT_EQ(v.retry_exceeded_errors, 1u);
    EXPECT_GE(v.flushed_completions, 1u);  // the receiver's posted receives, at least
    EXPECT_EQ(v.remote_access_errors + v.rnr_errors + v.local_errors, 0u);
    EXPECT_EQ(v.segments_failed, 6u);
    EXPECT_EQ(v.segments_acked, 1u);
    EXPECT_EQ(link.sender_peer_.Snapshot().sends_failed, 6u);
    EXPECT_EQ(link.sender_peer_.Snapshot().acks_received, 1u);
    EXPECT_EQ(v.channel_failures, 2u);   // the sender by its error, the receiver by a flush
    EXPECT_EQ(v.credits_available, 0u);  // a failed sender has none
    EXPECT_EQ(v.queue_pairs, 2u);        // until the owner destroys the channels
  }
  {
    // A remote access error (a clear-to-send naming memory not registered).
    Link link(SmallLimits(), 1 << 20);
    link.receiver_log_.destination_rkey = 0xdead;
    ASSERT_TRUE(link.Post(0, 0, 4000).ok());
    link.Settle();
    EXPECT_EQ(Snapshot(link.counters_).remote_access_errors, 1u);
  }
  {
    // A peer that went down (the transport aborts both ends): not a channel failure.
    Link link(SmallLimits(), 1 << 20);
    ASSERT_TRUE(link.Post(0, 0, 64).ok());
    link.sender_->Abort_st(absl::UnavailableError("peer down"));
    link.receiver_->Abort_st(absl::UnavailableError("peer down"));
    const VerbsStats v = Snapshot(link.counters_);
    EXPECT_EQ(v.channel_failures, 0u);
    EXPECT_EQ(v.segments_failed, 1u);
  }
}

TEST(VerbsChannelTest, TheFakeNicReportsAnRnrWhenNoReceiveIsPosted) {
  // The protocol never lets this happen; the fake must still catch it if it did.
  FakeNic nic;
  auto [a, b] = nic.ConnectedPair();
  std::vector<uint8_t> buf(64, 1);
  const fake::MemoryKeys k = nic.Register(buf.data(), buf.size(), false);
  SendWork w;
  w.op = WorkOp::kSend;
  w.sge[0] = {reinterpret_cast<uint64_t>(buf.data()), 64, k.lkey};
  w.num_sge = 1;
  w.signaled = true;
  ASSERT_TRUE(a->PostSend(w).ok());
  nic.Run();
  EXPECT_EQ(nic.rnr_errors(), 1u);
  const std::vector<Completion> c = a->TakeCompletions();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, CompletionStatus::kReceiverNotReady);
  EXPECT_TRUE(a->in_error() && b->in_error());
  VerbsCounters counters;
  CountCompletion(counters, c[0]);
  VerbsStats v;
  counters.SnapshotInto(v);
  EXPECT_EQ(v.rnr_errors, 1u);
  EXPECT_EQ(v.completions, 1u);
}

}  // namespace
}  // namespace gradlane::transport::verbs
