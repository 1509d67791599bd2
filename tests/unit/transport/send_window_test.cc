// The send side of a datagram connection (transport/datagram/send_window.h) on virtual time:
// the receiver's credit and our window bound what goes out, RTT samples give the RTO (RFC 6298)
// except from retransmitted packets (Karn), the timer restarts on every new ack, expiries double
// the RTO and resend at most a burst, and selective acks trigger fast retransmission of holes.
#include "transport/datagram/send_window.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <random>
#include <vector>

namespace gradlane::transport::datagram {
namespace {

constexpr TimeNs kUs = sched::kMicrosecond;
constexpr TimeNs kMs = sched::kMillisecond;
constexpr SendWindow::Timing kTiming{
    .initial_rto = 10 * kMs, .min_rto = 1 * kMs, .max_rto = 200 * kMs, .rto_burst = 16};

SendWindow Fresh(uint32_t credit = kMaxWindow) {
  SendWindow w;
  w.Init();
  w.Reset(kTiming);
  w.SetInitialCredit(credit);
  return w;
}

// Sends up to `n` new packets at `now` (fewer if the window or the credit stops it).
int SendNew(SendWindow& w, int n, TimeNs now, uint32_t window = kMaxWindow) {
  int sent = 0;
  while (sent < n && w.CanSendNew(window)) {
    w.Stage(/*msg=*/w.next(), /*offset=*/0, /*len=*/100, kPktFirst | kPktLast, now);
    w.Commit(now);
    ++sent;
  }
  return sent;
}

SendWindow::AckResult Ack(SendWindow& w, uint64_t ack, TimeNs now,
                          std::initializer_list<uint64_t> sacked = {},
                          uint32_t credit = kMaxWindow) {
  uint64_t bits[4] = {0, 0, 0, 0};
  for (uint64_t s : sacked) BitSet(bits, s, true);
  return w.OnAck(ack, bits, credit, now);
}

// Runs Retransmit at `now`, recording which packets it resent.
struct Resent {
  SendWindow::RetransmitResult r;
  std::vector<uint64_t> seqs;
};
Resent Retransmit(SendWindow& w, TimeNs now) {
  Resent out;
  out.r = w.Retransmit(now, [&](uint64_t seq) {
    out.seqs.push_back(seq);
    return SendWindow::Resend::kSent;
  });
  return out;
}

TEST(SendWindow, CreditBoundsNewPacketsAndIsNeverTakenBack) {
  SendWindow w = Fresh(/*credit=*/4);
  EXPECT_EQ(SendNew(w, 100, 0), 4);
  EXPECT_TRUE(w.IsLastAllowed(3, kMaxWindow));  // the receiver should ack the 4th at once
  EXPECT_FALSE(w.IsLastAllowed(2, kMaxWindow));
  Ack(w, 2, 1 * kMs, {}, /*credit=*/4);  // room up to 2 + 4
  EXPECT_EQ(w.peer_limit(), 6u);
  EXPECT_EQ(SendNew(w, 100, 1 * kMs), 2);
  Ack(w, 3, 2 * kMs, {}, /*credit=*/1);  // a smaller credit later: 3 + 1 < 6, the limit stays
  EXPECT_EQ(w.peer_limit(), 6u);
  EXPECT_FALSE(w.CanSendNew(kMaxWindow));
  EXPECT_EQ(w.next(), 6u);
}

TEST(SendWindow, OurWindowBoundsNewPacketsToo) {
  SendWindow w = Fresh();
  EXPECT_EQ(SendNew(w, 100, 0, /*window=*/8), 8);
  EXPECT_TRUE(w.IsLastAllowed(7, 8));
  Ack(w, 5, 1 * kMs);
  EXPECT_EQ(SendNew(w, 100, 1 * kMs, 8), 5);
  EXPECT_EQ(w.next(), w.una() + 8);
}

// Whatever a receiver grants, in whatever order its headers arrive, the sender never has a
// packet at or beyond the largest ack + credit it has seen, nor more than the window in flight.
TEST(SendWindow, CreditIsNeverExceededUnderReorderedAcks) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 50; ++round) {
    const uint32_t window = 1 + rng() % kMaxWindow;
    const uint32_t first_credit = rng() % 64;
    SendWindow w = Fresh(first_credit);
    uint64_t limit = first_credit;
    uint64_t delivered = 0;                              // what the receiver has received so far
    std::vector<std::pair<uint64_t, uint32_t>> headers;  // (ack, credit) in flight back to us
    TimeNs now = 0;
    for (int step = 0; step < 400; ++step) {
      now += 10 * kUs;
      SendNew(w, static_cast<int>(rng() % 32), now, window);
      ASSERT_LE(w.next(), limit);
      ASSERT_LE(w.next() - w.una(), window);
      // The receiver takes some of what was sent and answers with a fresh credit.
      delivered = std::max<uint64_t>(delivered, w.una() + rng() % (w.next() - w.una() + 1));
      headers.emplace_back(delivered, static_cast<uint32_t>(rng() % 64));
      // Headers come back in any order.
      if (!headers.empty() && rng() % 2 == 0) {
        const size_t i = rng() % headers.size();
        const auto [ack, credit] = headers[i];
        headers.erase(headers.begin() + static_cast<long>(i));
        const SendWindow::AckResult r = Ack(w, ack, now, {}, credit);
        if (!r.stale) limit = std::max(limit, ack + credit);
        EXPECT_EQ(w.peer_limit(), limit);
      }
    }
  }
}

TEST(SendWindow, StaleAckIsIgnored) {
  SendWindow w = Fresh(/*credit=*/10);
  SendNew(w, 10, 0);
  EXPECT_TRUE(Ack(w, 5, 1 * kMs, {}, 10).advanced);
  const SendWindow::AckResult r = Ack(w, 3, 2 * kMs, {7}, 200);
  EXPECT_TRUE(r.stale);
  EXPECT_EQ(w.una(), 5u);
  EXPECT_EQ(w.peer_limit(), 15u);
  EXPECT_FALSE(w.packet(7).sacked);
}

TEST(SendWindow, RttSamplesGiveTheRtoOfRfc6298) {
  SendWindow w = Fresh();
  EXPECT_FALSE(w.have_rtt());
  EXPECT_EQ(w.rto(), 10 * kMs);  // initial_rto until the first sample
  SendNew(w, 1, 0);
  Ack(w, 1, 2 * kMs);
  // First sample R: SRTT = R, RTTVAR = R/2, RTO = SRTT + 4 RTTVAR.
  EXPECT_TRUE(w.have_rtt());
  EXPECT_EQ(w.srtt(), 2 * kMs);
  EXPECT_EQ(w.rttvar(), 1 * kMs);
  EXPECT_EQ(w.rto(), 6 * kMs);
  // Then RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|, SRTT = 7/8 SRTT + 1/8 R.
  SendNew(w, 1, 10 * kMs);
  Ack(w, 2, 14 * kMs);
  EXPECT_EQ(w.rttvar(), 1250 * kUs);
  EXPECT_EQ(w.srtt(), 2250 * kUs);
  EXPECT_EQ(w.rto(), 7250 * kUs);
  EXPECT_EQ(w.timer_at(), sched::kNever);  // nothing in flight
}

TEST(SendWindow, RtoIsClampedToItsBounds) {
  SendWindow w = Fresh();
  SendNew(w, 1, 0);
  Ack(w, 1, 10 * kUs);  // 30 us computed
  EXPECT_EQ(w.rto(), kTiming.min_rto);
  SendWindow slow = Fresh();
  SendNew(slow, 1, 0);
  Ack(slow, 1, 150 * kMs);  // 450 ms computed
  EXPECT_EQ(slow.rto(), kTiming.max_rto);
}

TEST(SendWindow, EachExpiryResendsAndDoublesTheRtoUpToItsMaximum) {
  SendWindow w = Fresh();
  SendNew(w, 1, 0);
  EXPECT_EQ(w.timer_at(), 10 * kMs);
  TimeNs at = 10 * kMs;
  for (TimeNs want : {20 * kMs, 40 * kMs, 80 * kMs, 160 * kMs, 200 * kMs, 200 * kMs}) {
    EXPECT_TRUE(Retransmit(w, at - 1).seqs.empty()) << "not a moment before " << at;
    const Resent r = Retransmit(w, at);
    ASSERT_EQ(r.seqs, std::vector<uint64_t>{0}) << at;
    EXPECT_TRUE(r.r.timed_out);
    EXPECT_EQ(w.rto(), want);
    at += want;
  }
  EXPECT_EQ(w.packet(0).sends, 7);
}

// Karn's rule: the ack of a packet sent twice cannot say which copy it answers, so it gives no
// RTT sample; it still ends the back-off (the RTO is recomputed from the estimate it had).
TEST(SendWindow, KarnsRuleNoSampleFromARetransmittedPacket) {
  SendWindow w = Fresh();
  SendNew(w, 1, 0);
  Ack(w, 1, 2 * kMs);  // SRTT 2 ms, RTTVAR 1 ms, RTO 6 ms
  SendNew(w, 1, 10 * kMs);
  ASSERT_EQ(Retransmit(w, 16 * kMs).seqs, std::vector<uint64_t>{1});
  EXPECT_EQ(w.rto(), 12 * kMs);
  Ack(w, 2, 16 * kMs + 100 * kUs);  // 100 us after the resend, 6.1 ms after the first send
  EXPECT_EQ(w.srtt(), 2 * kMs);
  EXPECT_EQ(w.rttvar(), 1 * kMs);
  EXPECT_EQ(w.rto(), 6 * kMs);

  // Without any estimate yet, the backed-off RTO stays until a clean sample arrives.
  SendWindow v = Fresh();
  SendNew(v, 1, 0);
  ASSERT_EQ(Retransmit(v, 10 * kMs).seqs, std::vector<uint64_t>{0});
  Ack(v, 1, 11 * kMs);
  EXPECT_FALSE(v.have_rtt());
  EXPECT_EQ(v.rto(), 20 * kMs);
}

// RFC 6298 5.3: the timer restarts when the cumulative ack moves, so packets behind others are
// not presumed lost while acks keep coming.
TEST(SendWindow, TimerRestartsWhenTheCumulativeAckMoves) {
  SendWindow w = Fresh();
  SendNew(w, 4, 0);
  Ack(w, 2, 9 * kMs);  // a 9 ms sample: SRTT 9, RTTVAR 4.5, RTO 27 ms
  ASSERT_EQ(w.rto(), 27 * kMs);
  const Resent early = Retransmit(w, 10 * kMs);  // 10 ms after their send, 1 ms after the ack
  EXPECT_TRUE(early.seqs.empty());
  EXPECT_EQ(w.timer_at(), 36 * kMs);
  const Resent late = Retransmit(w, 36 * kMs);
  EXPECT_EQ(late.seqs, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(late.r.timed_out);
}

TEST(SendWindow, OneExpiryResendsAtMostABurstOldestFirst) {
  SendWindow w = Fresh();
  SendNew(w, 40, 0);
  const Resent first = Retransmit(w, 10 * kMs);
  ASSERT_EQ(first.seqs.size(), 16u);
  EXPECT_EQ(first.seqs.front(), 0u);
  EXPECT_EQ(first.seqs.back(), 15u);
  EXPECT_EQ(w.rto(), 20 * kMs);
  // The other 24 were due too: the next 16 go one timeout later.
  EXPECT_EQ(w.timer_at(), 20 * kMs);
  const Resent second = Retransmit(w, 20 * kMs);
  ASSERT_EQ(second.seqs.size(), 16u);
  EXPECT_EQ(second.seqs.front(), 16u);
  EXPECT_EQ(second.seqs.back(), 31u);
}

TEST(SendWindow, SelectiveAcksTriggerFastRetransmissionOfHoles) {
  SendWindow w = Fresh();
  SendNew(w, 1, 0);
  Ack(w, 1, 1 * kMs);       // SRTT 1 ms, RTO 3 ms
  SendNew(w, 10, 2 * kMs);  // packets 1..10
  // The peer holds 4, 5, 6 but not 1, 2, 3: a hole is resent once the peer holds a packet
  // kDupThresh (3) or more past it, so 1..3; 7..10 may still be on their way.
  Ack(w, 1, 2 * kMs + 500 * kUs, {4, 5, 6});
  EXPECT_TRUE(Retransmit(w, 2 * kMs + 500 * kUs).seqs.empty());  // within an RTT of their send
  Ack(w, 1, 3 * kMs, {4, 5, 6});
  const Resent r = Retransmit(w, 3 * kMs);
  EXPECT_EQ(r.seqs, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_FALSE(r.r.timed_out);  // no back-off for a fast retransmission
  EXPECT_EQ(w.rto(), 3 * kMs);
  EXPECT_TRUE(w.packet(4).sacked);
  // The same selective ack again: the holes were just resent, not again within an RTT.
  Ack(w, 1, 3 * kMs + 100 * kUs, {4, 5, 6});
  EXPECT_TRUE(Retransmit(w, 3 * kMs + 100 * kUs).seqs.empty());
  // On expiry, only what the peer does not hold is resent.
  const Resent timeout = Retransmit(w, 5 * kMs);
  EXPECT_EQ(timeout.seqs, (std::vector<uint64_t>{7, 8, 9, 10}));
  EXPECT_TRUE(timeout.r.timed_out);
}

TEST(SendWindow, FullLinkRetriesNextStepAndGoneStops) {
  SendWindow w = Fresh();
  SendNew(w, 5, 0);
  int calls = 0;
  const SendWindow::RetransmitResult full = w.Retransmit(10 * kMs, [&](uint64_t) {
    return ++calls == 3 ? SendWindow::Resend::kLinkFull : SendWindow::Resend::kSent;
  });
  EXPECT_EQ(full.resent, 2u);
  EXPECT_TRUE(full.timed_out);
  EXPECT_EQ(w.timer_at(), 10 * kMs);  // looked at again on the next step
  EXPECT_EQ(w.packet(2).sends, 1);
  // The back-off covers the packets the full link kept back too: they are due at the doubled RTO.
  EXPECT_TRUE(Retransmit(w, 10 * kMs + 1).seqs.empty());
  const TimeNs rto = w.rto();
  const SendWindow::RetransmitResult gone =
      w.Retransmit(20 * kMs, [&](uint64_t) { return SendWindow::Resend::kGone; });
  EXPECT_TRUE(gone.gone);
  EXPECT_EQ(gone.resent, 0u);
  EXPECT_EQ(w.rto(), rto);
}

TEST(SendWindow, ResetStartsAFreshConnection) {
  SendWindow w = Fresh();
  SendNew(w, 3, 0);
  Retransmit(w, 10 * kMs);
  w.Reset(kTiming);
  EXPECT_EQ(w.next(), 0u);
  EXPECT_EQ(w.una(), 0u);
  EXPECT_EQ(w.peer_limit(), 0u);
  EXPECT_FALSE(w.CanSendNew(kMaxWindow));  // until the peer's hello says its credit
  EXPECT_EQ(w.rto(), kTiming.initial_rto);
  EXPECT_FALSE(w.have_rtt());
  EXPECT_EQ(w.timer_at(), sched::kNever);
}

}  // namespace
}  // namespace gradlane::transport::datagram
