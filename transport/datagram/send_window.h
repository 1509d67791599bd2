// transport/datagram/send_window.h — the send side of one connection of the reliable datagram
// protocol: which packets are in flight, what the peer has acknowledged, and what to send again.
//
// Packets carry per-connection sequence numbers from 0. A packet may be sent while it lies below
// both una + window (our own bound, at most kMaxWindow: the acknowledgement bitmaps cover that
// many) and the peer's limit, ack + credit from the newest header it sent, so a receiver's
// reorder buffer is never overrun. The limit only grows: credit once granted is not taken back,
// because packets sent against it may already be on the wire.
//
// Loss recovery follows TCP, as eRPC and Machnet do for datagram transports:
//   - the retransmission timeout comes from RTT samples per RFC 6298 (SRTT/RTTVAR, clamped to
//     [min_rto, max_rto]), sampled only from packets sent once (Karn's rule: the ack of a
//     retransmitted packet cannot tell which copy it answers), doubled on every expiry;
//   - the timer restarts whenever the cumulative ack moves (RFC 6298 5.3): packets queued behind
//     a window's worth of others on a slow link are not presumed lost while acks still flow;
//   - one expiry resends at most rto_burst packets, oldest first; the rest wait for the
//     selective acks those provoke, so a spurious timeout costs little;
//   - a hole is resent early (fast retransmission) once the peer has selectively acknowledged a
//     packet kDupThresh or more past it and an RTT (before the first sample: an RTO) has
//     passed since it was last sent.
//
// The window does not know what a packet holds: the transport records each packet's message,
// offset and length here, and rebuilds the datagram from them when one is resent (the payload
// stays in the sender's memory until acknowledged).
//
// Guarantees: the packet ring is sized once by Init (control path); nothing else allocates.
// Single-threaded: the engine thread that owns the connection.
#ifndef GRADLANE_TRANSPORT_DATAGRAM_SEND_WINDOW_H_
#define GRADLANE_TRANSPORT_DATAGRAM_SEND_WINDOW_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "sched/types.h"
#include "transport/datagram/datagram_wire.h"

namespace gradlane::transport::datagram {

using sched::TimeNs;

class SendWindow {
 public:
  // A hole is resent early once the peer holds a packet this many or more past it.
  static constexpr uint64_t kDupThresh = 3;

  struct Timing {
    TimeNs initial_rto = 0;
    TimeNs min_rto = 0;
    TimeNs max_rto = 0;
    uint32_t rto_burst = 0;  // packets one expiry resends
  };

  // One packet in flight.
  struct Packet {
    uint64_t msg = 0;     // the message (segment) it carries bytes of
    uint32_t offset = 0;  // where in that message
    uint32_t len = 0;
    uint16_t flags = 0;   // kPktFirst / kPktLast
    uint16_t sends = 0;   // 1: never resent (an RTT sample may come from it)
    bool sacked = false;  // the peer holds it: never resent
    TimeNs sent_at = 0;   // last (re)transmission
  };

  // What the transport's resend callback reports for one packet.
  enum class Resend { kSent, kLinkFull, kGone };
  struct RetransmitResult {
    uint32_t resent = 0;     // packets sent again
    bool timed_out = false;  // the timer expired (and the RTO was doubled)
    bool gone = false;       // the callback said the connection went away: stop using it
  };

  // Control path, once per connection slot: sizes the ring for kMaxWindow packets.
  void Init();
  // A new connection: sequence numbers from 0, no RTT estimate yet, the RTO at initial_rto.
  // Keeps the ring.
  void Reset(const Timing& timing);
  // The credit the peer offered in its hello or hello-ok: packets below it may go out.
  void SetInitialCredit(uint32_t credit);

  // ---- sending new packets
  // A new packet fits both our window and the peer's limit.
  bool CanSendNew(uint32_t window) const { return nxt_ < una_ + window && nxt_ < peer_limit_; }
  // Records the packet about to be sent as sequence next(); it counts as sent once Commit is
  // called (the link may have had no room: then the next Stage overwrites it).
  void Stage(uint64_t msg, uint32_t offset, uint32_t len, uint16_t flags, TimeNs now);
  void Commit(TimeNs now);
  // `seq` is the last packet the window or the peer's limit allows now: the receiver should ack
  // it at once rather than after its delay, or the sender stalls for that delay.
  bool IsLastAllowed(uint64_t seq, uint32_t window) const {
    return seq + 1 == una_ + window || seq + 1 == peer_limit_;
  }

  // ---- acknowledgements
  struct AckResult {
    bool stale = false;     // older than one already processed: ignore the whole header
    bool advanced = false;  // the cumulative ack moved
  };
  // A header's acknowledgement fields: every packet below `ack` received, `sack` bit (s % 256)
  // for packets held past it, and the peer's credit. The caller has checked ack <= next().
  AckResult OnAck(uint64_t ack, const uint64_t (&sack)[4], uint32_t credit, TimeNs now);

  // ---- loss recovery
  // Resends what is due, at `now`: expired packets (up to rto_burst) and holes the selective
  // acks show, through `resend`, which must not call back into this window. Returns what it did;
  // the caller counts retransmissions and timeouts.
  RetransmitResult Retransmit(TimeNs now, absl::FunctionRef<Resend(uint64_t seq)> resend);

  // ---- state
  uint64_t una() const { return una_; }   // oldest unacknowledged packet
  uint64_t next() const { return nxt_; }  // next new sequence number
  uint64_t peer_limit() const { return peer_limit_; }
  bool in_flight() const { return una_ != nxt_; }
  const Packet& packet(uint64_t seq) const { return pkts_[seq & (kMaxWindow - 1)]; }
  // When Retransmit has something to do next (sched::kNever: nothing in flight).
  TimeNs timer_at() const { return timer_at_; }
  TimeNs rto() const { return rto_; }
  bool have_rtt() const { return have_rtt_; }
  TimeNs srtt() const { return srtt_; }
  TimeNs rttvar() const { return rttvar_; }

 private:
  Packet& Pkt(uint64_t seq) { return pkts_[seq & (kMaxWindow - 1)]; }

  Timing timing_;
  std::vector<Packet> pkts_;
  uint64_t una_ = 0, nxt_ = 0, peer_limit_ = 0, highest_sacked_ = 0;
  bool sack_holes_ = false;  // a selective ack showed holes not yet looked at
  TimeNs srtt_ = 0, rttvar_ = 0, rto_ = 0;
  bool have_rtt_ = false;
  TimeNs acked_at_ = 0;  // when una last moved: the retransmission timer restarts there
  TimeNs timer_at_ = sched::kNever;
};

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_SEND_WINDOW_H_
