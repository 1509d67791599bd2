// The receive side of a datagram connection (transport/datagram/reorder_buffer.h): packets are
// released in sequence order exactly once whatever order and how often they arrive, early ones
// are held (copied) within the capacity and refused beyond it, the acknowledgement fields say
// what arrived, and the delayed-ack rules decide when a pure ack is owed.
#include "transport/datagram/reorder_buffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

namespace gradlane::transport::datagram {
namespace {

constexpr TimeNs kUs = sched::kMicrosecond;
constexpr uint32_t kEvery = 16;
constexpr TimeNs kDelay = 50 * kUs;

// Packet `seq` of a test stream: one message per packet, its bytes derived from seq.
struct Source {
  std::vector<uint8_t> bytes;
  ReorderBuffer::Packet For(uint64_t seq, size_t len = 8) {
    bytes.assign(len, 0);
    for (size_t i = 0; i < len; ++i) bytes[i] = static_cast<uint8_t>(seq * 31 + i);
    return ReorderBuffer::Packet{kPktFirst | kPktLast, seq, 0, bytes};
  }
};

// Feeds one packet and consumes whatever becomes deliverable, appending the released
// sequence numbers (taken from the packets' msg field) to `out`.
ReorderBuffer::Verdict Feed(ReorderBuffer& rb, uint64_t seq, std::vector<uint64_t>& out,
                            TimeNs now = 0, size_t len = 8) {
  Source src;
  ReorderBuffer::Packet p = src.For(seq, len);
  const ReorderBuffer::Verdict v = rb.OnPacket(seq, p, now);
  if (v != ReorderBuffer::Verdict::kInOrder) return v;
  do {
    EXPECT_EQ(p.msg, rb.next());
    std::vector<uint8_t> want(p.bytes.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(p.msg * 31 + i);
    EXPECT_TRUE(std::equal(p.bytes.begin(), p.bytes.end(), want.begin(), want.end()))
        << "packet " << p.msg;
    out.push_back(p.msg);
    rb.Consumed();
  } while (rb.NextHeld(&p));
  return v;
}

ReorderBuffer Make(uint32_t capacity = 8, uint32_t slot_bytes = 64) {
  ReorderBuffer rb;
  rb.Init(capacity, slot_bytes);
  rb.Reset();
  return rb;
}

DgramHeader AckOf(ReorderBuffer& rb, uint32_t credit = 8) {
  DgramHeader h{};
  rb.FillAck(h, credit);
  return h;
}

TEST(ReorderBuffer, InOrderPacketsAreReleasedAtOnce) {
  ReorderBuffer rb = Make();
  Source src;
  const ReorderBuffer::Packet p = src.For(0);
  EXPECT_EQ(rb.OnPacket(0, p, 0), ReorderBuffer::Verdict::kInOrder);
  rb.Consumed();
  std::vector<uint64_t> out;
  for (uint64_t s = 1; s < 20; ++s) EXPECT_EQ(Feed(rb, s, out), ReorderBuffer::Verdict::kInOrder);
  EXPECT_EQ(rb.next(), 20u);
  EXPECT_EQ(out.size(), 19u);
}

TEST(ReorderBuffer, EarlyPacketsAreHeldAndReleasedInOrder) {
  ReorderBuffer rb = Make();
  std::vector<uint64_t> out;
  EXPECT_EQ(Feed(rb, 3, out), ReorderBuffer::Verdict::kHeld);
  EXPECT_EQ(Feed(rb, 1, out), ReorderBuffer::Verdict::kHeld);
  EXPECT_EQ(Feed(rb, 2, out), ReorderBuffer::Verdict::kHeld);
  EXPECT_TRUE(out.empty());
  DgramHeader h = AckOf(rb);
  EXPECT_EQ(h.ack, 0u);
  EXPECT_FALSE(BitTest(h.sack, 0));
  EXPECT_TRUE(BitTest(h.sack, 1) && BitTest(h.sack, 2) && BitTest(h.sack, 3));
  EXPECT_FALSE(BitTest(h.sack, 4));
  EXPECT_EQ(Feed(rb, 0, out), ReorderBuffer::Verdict::kInOrder);
  EXPECT_EQ(out, (std::vector<uint64_t>{0, 1, 2, 3}));
  h = AckOf(rb);
  EXPECT_EQ(h.ack, 4u);
  EXPECT_EQ(h.sack[0] | h.sack[1] | h.sack[2] | h.sack[3], 0u);  // nothing held any more
}

TEST(ReorderBuffer, HeldBytesAreACopy) {
  ReorderBuffer rb = Make();
  std::vector<uint8_t> wire = {1, 2, 3, 4, 5};
  ASSERT_EQ(rb.OnPacket(1, ReorderBuffer::Packet{kPktLast, 7, 100, wire}, 0),
            ReorderBuffer::Verdict::kHeld);
  std::fill(wire.begin(), wire.end(), 0);  // the link reuses its buffer
  ASSERT_EQ(rb.OnPacket(0, ReorderBuffer::Packet{kPktFirst, 7, 0, wire}, 0),
            ReorderBuffer::Verdict::kInOrder);
  rb.Consumed();
  ReorderBuffer::Packet p;
  ASSERT_TRUE(rb.NextHeld(&p));
  EXPECT_EQ(p.flags, kPktLast);
  EXPECT_EQ(p.msg, 7u);
  EXPECT_EQ(p.msg_offset, 100u);
  EXPECT_EQ(std::vector<uint8_t>(p.bytes.begin(), p.bytes.end()),
            (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  rb.Consumed();
  EXPECT_FALSE(rb.NextHeld(&p));
}

TEST(ReorderBuffer, RefusesWhatLiesBeyondItsCapacity) {
  ReorderBuffer rb = Make(/*capacity=*/8, /*slot_bytes=*/64);
  std::vector<uint64_t> out;
  EXPECT_EQ(Feed(rb, 8, out), ReorderBuffer::Verdict::kBeyondCapacity);  // next() + capacity
  EXPECT_EQ(Feed(rb, 1000, out), ReorderBuffer::Verdict::kBeyondCapacity);
  EXPECT_EQ(Feed(rb, 7, out), ReorderBuffer::Verdict::kHeld);  // the last slot
  // An early packet larger than a slot cannot be held; in order, any size goes straight through.
  EXPECT_EQ(Feed(rb, 2, out, 0, 65), ReorderBuffer::Verdict::kBeyondCapacity);
  EXPECT_EQ(Feed(rb, 2, out, 0, 64), ReorderBuffer::Verdict::kHeld);
  EXPECT_EQ(Feed(rb, 0, out, 0, 9000), ReorderBuffer::Verdict::kInOrder);
  EXPECT_EQ(out, std::vector<uint64_t>{0});
  // The window moved: 8 fits now.
  EXPECT_EQ(Feed(rb, 8, out), ReorderBuffer::Verdict::kHeld);
  EXPECT_FALSE(BitTest(AckOf(rb).sack, 1000));
}

TEST(ReorderBuffer, DuplicatesAreDroppedAndTheFirstCopyWins) {
  ReorderBuffer rb = Make();
  std::vector<uint64_t> out;
  Feed(rb, 0, out);
  EXPECT_EQ(Feed(rb, 0, out), ReorderBuffer::Verdict::kDuplicate);  // released already
  std::vector<uint8_t> first = {9, 9}, second = {1, 1};
  EXPECT_EQ(rb.OnPacket(2, ReorderBuffer::Packet{0, 2, 0, first}, 0),
            ReorderBuffer::Verdict::kHeld);
  EXPECT_EQ(rb.OnPacket(2, ReorderBuffer::Packet{0, 2, 0, second}, 0),
            ReorderBuffer::Verdict::kDuplicate);
  Source src;
  ReorderBuffer::Packet p = src.For(1);
  ASSERT_EQ(rb.OnPacket(1, p, 0), ReorderBuffer::Verdict::kInOrder);
  rb.Consumed();
  ASSERT_TRUE(rb.NextHeld(&p));
  EXPECT_EQ(std::vector<uint8_t>(p.bytes.begin(), p.bytes.end()), first);
  rb.Consumed();
  EXPECT_EQ(rb.next(), 3u);
}

// Any arrival order within the capacity, with duplicates and stale retransmissions mixed in:
// every packet comes out once, in sequence order, and slots are reused safely across wraps.
TEST(ReorderBuffer, ReleasesEachPacketOnceInOrderUnderShuffledDuplicatedArrivals) {
  std::mt19937_64 rng(5);
  for (uint32_t capacity : {1u, 3u, 8u, 256u}) {
    ReorderBuffer rb = Make(capacity, 16);
    std::vector<uint64_t> out;
    constexpr uint64_t kN = 3000;
    uint64_t sent = 0;  // the sender's next new packet
    while (rb.next() < kN) {
      // The sender (re)sends anything in [next, min(next + capacity, sent + a few)), in any order;
      // now and then something old, or something beyond the credit.
      sent = std::min<uint64_t>(kN, std::max(sent, rb.next() + rng() % (capacity + 1)));
      const uint64_t lo = rb.next();
      uint64_t seq = lo + rng() % (std::max<uint64_t>(sent, lo + 1) - lo);
      const int r = static_cast<int>(rng() % 10);
      if (r == 0 && lo > 0) seq = rng() % lo;         // stale retransmission
      if (r == 1) seq = lo + capacity + rng() % 100;  // beyond the credit
      Feed(rb, seq, out);
    }
    ASSERT_EQ(out.size(), kN) << "capacity " << capacity;
    for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], i) << "capacity " << capacity;
  }
}

TEST(ReorderBuffer, MessagesCompleteInOrderAndRejectionsAreReported) {
  ReorderBuffer rb = Make();
  rb.CompleteMessage(true);
  rb.CompleteMessage(false);
  rb.CompleteMessage(true);
  EXPECT_EQ(rb.next_message(), 3u);
  const DgramHeader h = AckOf(rb, /*credit=*/5);
  EXPECT_EQ(h.msg_ack, 3u);
  EXPECT_FALSE(BitTest(h.rejected, 0));
  EXPECT_TRUE(BitTest(h.rejected, 1));
  EXPECT_FALSE(BitTest(h.rejected, 2));
  EXPECT_EQ(h.credit, 5u);
  // The bitmap is indexed modulo kMaxWindow: message 1 + kMaxWindow reuses (and rewrites) its bit.
  for (uint64_t m = 3; m <= kMaxWindow + 1; ++m) rb.CompleteMessage(true);
  EXPECT_FALSE(BitTest(AckOf(rb).rejected, 1));
}

TEST(ReorderBuffer, InOrderDataIsAckedAfterAckEveryPacketsOrTheDelay) {
  ReorderBuffer rb = Make(/*capacity=*/64);
  std::vector<uint64_t> out;
  EXPECT_FALSE(rb.AckDue(0, kEvery, kDelay));
  EXPECT_FALSE(rb.AckPending());
  Feed(rb, 0, out, /*now=*/1000);
  EXPECT_TRUE(rb.AckPending());
  EXPECT_FALSE(rb.AckDue(1000, kEvery, kDelay));
  EXPECT_FALSE(rb.AckDue(1000 + kDelay - 1, kEvery, kDelay));
  EXPECT_TRUE(
      rb.AckDue(1000 + kDelay, kEvery, kDelay));  // the delay runs from the first unacked one
  AckOf(rb);
  EXPECT_FALSE(rb.AckDue(1000 + kDelay, kEvery, kDelay));
  for (uint64_t s = 1; s < kEvery; ++s) Feed(rb, s, out, 2000);
  EXPECT_FALSE(rb.AckDue(2000, kEvery, kDelay));  // 15 unacked
  Feed(rb, kEvery, out, 2000);
  EXPECT_TRUE(rb.AckDue(2000, kEvery, kDelay));  // 16
}

TEST(ReorderBuffer, AnythingUnusualIsAckedAtOnce) {
  std::vector<uint64_t> out;
  {
    ReorderBuffer rb = Make();
    Feed(rb, 2, out);  // a hole: the sender should hear of it now
    EXPECT_TRUE(rb.AckDue(0, kEvery, kDelay));
  }
  {
    ReorderBuffer rb = Make();
    Feed(rb, 0, out);
    AckOf(rb);
    Feed(rb, 0, out);  // a duplicate: our ack was probably lost
    EXPECT_TRUE(rb.AckDue(0, kEvery, kDelay));
    EXPECT_FALSE(rb.AckPending());  // no new data: no delay timer
  }
  {
    ReorderBuffer rb = Make();
    Feed(rb, 100, out);  // beyond the credit
    EXPECT_TRUE(rb.AckDue(0, kEvery, kDelay));
  }
  {
    ReorderBuffer rb = Make();
    rb.CompleteMessage(true);  // a completion returns the sender's credit
    EXPECT_TRUE(rb.AckDue(0, kEvery, kDelay));
  }
  {
    ReorderBuffer rb = Make();
    rb.AckNow();  // the sender asked
    EXPECT_TRUE(rb.AckDue(0, kEvery, kDelay));
  }
}

TEST(ReorderBuffer, AnAckThatCouldNotBeSentIsStillOwed) {
  ReorderBuffer rb = Make();
  std::vector<uint64_t> out;
  Feed(rb, 0, out, 1000);
  Feed(rb, 2, out, 1000);
  const ReorderBuffer::Owed owed = rb.owed();
  AckOf(rb);
  EXPECT_FALSE(rb.AckDue(1000 + kDelay, kEvery, kDelay));
  rb.Restore(owed);  // the header carrying it found the link full
  EXPECT_TRUE(rb.AckDue(1000, kEvery, kDelay));
  EXPECT_TRUE(rb.AckPending());
}

TEST(ReorderBuffer, ResetForgetsTheOldConnection) {
  ReorderBuffer rb = Make();
  std::vector<uint64_t> out;
  Feed(rb, 0, out);
  Feed(rb, 3, out);
  rb.CompleteMessage(false);
  rb.Reset();
  EXPECT_EQ(rb.next(), 0u);
  EXPECT_EQ(rb.next_message(), 0u);
  EXPECT_FALSE(rb.AckDue(1 << 30, kEvery, kDelay));
  const DgramHeader h = AckOf(rb);
  EXPECT_EQ(h.sack[0] | h.rejected[0], 0u);
  out.clear();
  EXPECT_EQ(Feed(rb, 3, out), ReorderBuffer::Verdict::kHeld);  // the old slot 3 is empty again
  Feed(rb, 0, out);
  EXPECT_EQ(out, std::vector<uint64_t>{0});
}

}  // namespace
}  // namespace gradlane::transport::datagram
