// transport/common/completions.h — how a backend tells the engine what became of a peer and of
// its sends, counting as it tells: peer up, a send left / was acknowledged / was refused by the
// receiver, a segment arrived, and — the part every backend must get exactly right — failing a
// peer's pending sends in order and then reporting the peer down, exactly once.
//
// Why one copy: transport/transport.h promises, for every backend, that each posted send ends in
// exactly one of OnSendAcked_st / OnSendFailed_st, that a peer going down fails its pending sends
// in post order before OnPeerDown_st, and that OnPeerDown_st comes once, only for a peer the
// engine holds a handle for. The engine's credit window and its peer-down handling lean on all
// of it; three hand-written copies would drift.
//
// Guarantees: every call counts (per peer and in total) before it calls the handler, so a
// handler reading Stats() sees its own event. No allocation except a refused ack's status.
// Thread rules: the engine thread, inside the backend's _st methods; the handler may call back
// into the backend (PostSend_st, Disconnect_st), see FailPendingAndReportDown for what that
// may do mid-way.
#ifndef GRADLANE_TRANSPORT_COMMON_COMPLETIONS_H_
#define GRADLANE_TRANSPORT_COMMON_COMPLETIONS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace gradlane::transport {

// One posted segment until it is acknowledged or failed: the data frame's header, where the
// payload lives (the engine's region; referenced, not copied) and the engine's cookie.
struct PendingSend {
  FrameHeader header{};
  const uint8_t* payload = nullptr;
  uint64_t cookie = 0;

  SendCompletion CompletionFor(PeerHandle peer) const {
    return SendCompletion{peer, cookie, header.key, header.iteration, header.offset, header.length};
  }
};

class Completions {
 public:
  // Both must outlive this object (they are the backend's).
  Completions(TransportHandler* handler, TransportCounters* counters)
      : handler_(handler), counters_(counters) {}

  void CountError(WireError e) { counters_->errors[static_cast<size_t>(e)].Add_st(1); }

  // The handshake is done: sends to `peer` may flow.
  void PeerUp(const PeerInfo& peer) {
    counters_->peers_up.Add_st(1);
    handler_->OnPeerUp_st(peer);
  }

  // The whole frame of `s` has left (for TCP: the kernel holds it).
  void SendLeft(PeerHandle peer, PeerCounters& pc, const PendingSend& s) {
    pc.bytes_sent.Add_st(s.header.length);
    pc.frames_sent.Add_st(1);
    counters_->total.bytes_sent.Add_st(s.header.length);
    counters_->total.frames_sent.Add_st(1);
    handler_->OnSendDone_st(s.CompletionFor(peer));
  }

  // The peer acknowledged `s`; `rejected`: it had no destination for it, so the send fails
  // (FailedPrecondition) rather than counting as delivered.
  void SendAcked(PeerHandle peer, uint16_t peer_rank, PeerCounters& pc, const PendingSend& s,
                 bool rejected, TimeNs now) {
    const SendCompletion done = s.CompletionFor(peer);
    pc.acks_received.Add_st(1);
    counters_->total.acks_received.Add_st(1);
    if (!rejected) {
      handler_->OnSendAcked_st(done, now);
      return;
    }
    pc.sends_failed.Add_st(1);
    counters_->total.sends_failed.Add_st(1);
    handler_->OnSendFailed_st(done, absl::FailedPreconditionError(absl::StrFormat(
                                        "peer rank %d had no destination for key %d iteration %d",
                                        peer_rank, done.key, done.iteration)));
  }

  // An incoming segment's payload is in place (the backend acknowledges it after this).
  void Received(const PeerInfo& peer, PeerCounters& pc, const FrameHeader& h, const RecvTarget& t,
                TimeNs now) {
    pc.bytes_received.Add_st(h.length);
    pc.frames_received.Add_st(1);
    counters_->total.bytes_received.Add_st(h.length);
    counters_->total.frames_received.Add_st(1);
    handler_->OnRecvDone_st(peer, h, t, now);
  }

  // An acknowledgement is on its way to the peer.
  void AckSent(PeerCounters& pc) {
    pc.acks_sent.Add_st(1);
    counters_->total.acks_sent.Add_st(1);
  }

  // The peer is gone: fails every pending send, oldest first, with `why`, then reports the peer
  // down if `known` (the engine holds its handle) — and clears `known`, so a second call for the
  // same connection reports nothing. `pop_oldest()` returns the oldest pending send not yet
  // failed and forgets it (the backend's queue order: unacknowledged before unwritten), or
  // nullptr when none is left. Taking them one at a time keeps "each send fails once, in order,
  // all before the peer-down" even if a handler callback re-enters for the same connection: the
  // inner call fails the rest and reports down; the outer one then finds nothing. The backend
  // must already have marked the connection dead, so that a PostSend_st from a callback is
  // refused rather than queued behind the failure.
  template <class PopOldest>
  void FailPendingAndReportDown(const PeerInfo& peer, bool& known, PeerCounters& pc,
                                PopOldest&& pop_oldest, const absl::Status& why) {
    const bool report = known;
    known = false;
    while (const PendingSend* s = pop_oldest()) {
      pc.sends_failed.Add_st(1);
      counters_->total.sends_failed.Add_st(1);
      handler_->OnSendFailed_st(s->CompletionFor(peer.handle), why);
    }
    if (report) {
      counters_->peers_down.Add_st(1);
      handler_->OnPeerDown_st(peer, why);
    }
  }

 private:
  TransportHandler* const handler_;
  TransportCounters* const counters_;
};

}  // namespace gradlane::transport

#endif  // GRADLANE_TRANSPORT_COMMON_COMPLETIONS_H_
