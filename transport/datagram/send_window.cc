#include "transport/datagram/send_window.h"

#include <algorithm>

namespace gradlane::transport::datagram {

void SendWindow::Init() { pkts_.resize(kMaxWindow); }

void SendWindow::Reset(const Timing& timing) {
  timing_ = timing;
  una_ = nxt_ = peer_limit_ = highest_sacked_ = 0;
  sack_holes_ = false;
  srtt_ = rttvar_ = 0;
  rto_ = timing.initial_rto;
  have_rtt_ = false;
  acked_at_ = 0;
  timer_at_ = sched::kNever;
}

void SendWindow::SetInitialCredit(uint32_t credit) {
  peer_limit_ = std::min<uint64_t>(credit, kMaxWindow);
}

void SendWindow::Stage(uint64_t msg, uint32_t offset, uint32_t len, uint16_t flags, TimeNs now) {
  Packet& p = Pkt(nxt_);
  p.msg = msg;
  p.offset = offset;
  p.len = len;
  p.flags = flags;
  p.sends = 1;
  p.sacked = false;
  p.sent_at = now;
}

void SendWindow::Commit(TimeNs now) {
  ++nxt_;
  timer_at_ = std::min(timer_at_, now + rto_);
}

SendWindow::AckResult SendWindow::OnAck(uint64_t ack, const uint64_t (&sack)[4], uint32_t credit,
                                        TimeNs now) {
  AckResult r;
  if (ack < una_) {  // an older ack overtaken by a newer one
    r.stale = true;
    return r;
  }
  peer_limit_ = std::max(peer_limit_, ack + credit);
  if (ack > una_) {
    // RTT sample from the newest packet this ack covers, never from a retransmitted one (Karn).
    const Packet& p = Pkt(ack - 1);
    if (p.sends == 1 && !p.sacked) {
      const TimeNs rtt = std::max<TimeNs>(now - p.sent_at, 0);
      if (!have_rtt_) {
        srtt_ = rtt;
        rttvar_ = rtt / 2;
        have_rtt_ = true;
      } else {
        const TimeNs d = srtt_ > rtt ? srtt_ - rtt : rtt - srtt_;
        rttvar_ = (3 * rttvar_ + d) / 4;
        srtt_ = (7 * srtt_ + rtt) / 8;
      }
    }
    // Recomputed on every new ack, sample or not: this also ends an exponential back-off.
    if (have_rtt_) {
      rto_ = std::clamp<TimeNs>(srtt_ + std::max<TimeNs>(10 * sched::kMicrosecond, 4 * rttvar_),
                                timing_.min_rto, timing_.max_rto);
    }
    una_ = ack;
    acked_at_ = now;
    timer_at_ = una_ == nxt_ ? sched::kNever : std::min(timer_at_, now + rto_);
    r.advanced = true;
  }
  if ((sack[0] | sack[1] | sack[2] | sack[3]) != 0) {
    const uint64_t end = std::min(nxt_, una_ + kMaxWindow);
    for (uint64_t s = una_; s < end; ++s) {
      if (BitTest(sack, s)) {
        Pkt(s).sacked = true;
        highest_sacked_ = std::max(highest_sacked_, s);
      }
    }
    if (highest_sacked_ > una_) sack_holes_ = true;
  }
  return r;
}

SendWindow::RetransmitResult SendWindow::Retransmit(
    TimeNs now, absl::FunctionRef<Resend(uint64_t seq)> resend) {
  RetransmitResult r;
  if (una_ == nxt_) {
    timer_at_ = sched::kNever;
    sack_holes_ = false;
    return r;
  }
  if (now < timer_at_ && !sack_holes_) return r;
  const TimeNs fast_gap = have_rtt_ ? srtt_ : rto_;
  TimeNs next = sched::kNever;
  uint32_t expired_sent = 0;
  for (uint64_t s = una_; s != nxt_; ++s) {
    Packet& p = Pkt(s);
    if (p.sacked) continue;
    // A packet is presumed lost once a whole RTO has passed since it was sent *and* since the
    // cumulative ack last moved (RFC 6298 5.3 restarts the timer on every ack of new data).
    // Timed from its send alone, a packet queued behind a window's worth of others in a slow
    // link's queue (a 2.3 MB window is 18 ms at 1 Gbit/s) would time out while acks still
    // flow — spurious retransmissions by the thousand, measured at 1 Gbit/s under tbf.
    const TimeNs since = std::max(p.sent_at, acked_at_);
    const bool due = now - since >= rto_;
    const bool expired = due && expired_sent < timing_.rto_burst;
    const bool fast =
        sack_holes_ && s + kDupThresh <= highest_sacked_ && now - p.sent_at >= fast_gap;
    if (expired && !fast) ++expired_sent;
    if (expired || fast) {
      const Resend how = resend(s);
      if (how == Resend::kLinkFull) {
        next = now;  // try again next step
        break;
      }
      if (how == Resend::kGone) {
        r.gone = true;
        return r;
      }
      p.sent_at = now;
      ++p.sends;
      ++r.resent;
      r.timed_out |= expired;
    }
    // Due but past this timeout's burst: it waits a whole (backed-off) timeout for the acks.
    next =
        std::min(next, due && !expired && p.sent_at != now ? now + rto_
                                                           : std::max(p.sent_at, acked_at_) + rto_);
  }
  if (r.timed_out) rto_ = std::min(rto_ * 2, timing_.max_rto);  // back off (RFC 6298 5.5)
  sack_holes_ = false;
  timer_at_ = next;
  return r;
}

}  // namespace gradlane::transport::datagram
