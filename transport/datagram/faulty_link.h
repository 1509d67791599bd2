// transport/datagram/faulty_link.h — a DatagramLink wrapper that loses, reorders and duplicates
// what is sent through it, on purpose.
//
// The reliable protocol's claims (every byte arrives once, in order, despite loss, reordering and
// duplication) are only believable if they are exercised, and real networks misbehave too rarely
// to test against. DatagramTransport puts this wrapper between itself and its link whenever
// FaultOptions asks for any fault (the unit tests, the loss benchmark, gradlaned's --dpdk_drop_*
// flags); in production all options are zero and the wrapper is not there at all.
//
// The faults are drawn from a seeded generator (splitmix64), so a fault pattern is replayed
// exactly by the same seed and the same sequence of sends.
//   drop: every drop_every-th datagram, and/or each with drop_probability. Send_st says "sent":
//         the wire lost it.
//   duplicate: the datagram is sent twice, back to back.
//   reorder: the datagram is held back and sent right after the next one that goes out (or at
//         ReleaseHeld_st, which the transport calls at the end of each step). One at a time.
// Only transmission is faulted; what the inner link receives is passed up untouched.
//
// Guarantees: the held datagram's head is copied into a buffer sized at construction (a head
// longer than that is never held); its body stays referenced, as the DatagramLink contract
// allows. No allocation after construction. Thread rules: `_st` on the engine thread that owns
// the transport; Stats() from any thread (relaxed atomics).
#ifndef GRADLANE_TRANSPORT_DATAGRAM_FAULTY_LINK_H_
#define GRADLANE_TRANSPORT_DATAGRAM_FAULTY_LINK_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "transport/datagram/datagram_link.h"
#include "transport/transport.h"

namespace gradlane::transport::datagram {

// Transmit-side fault injection (tests and the loss benchmark; all zero in production).
struct FaultOptions {
  uint32_t drop_every = 0;           // drop every Nth datagram sent (0: never)
  double drop_probability = 0;       // and/or each with this probability
  double reorder_probability = 0;    // hold a datagram back and send it after the next one
  double duplicate_probability = 0;  // send a datagram twice
  uint64_t seed = 1;
  bool any() const {
    return drop_every != 0 || drop_probability > 0 || reorder_probability > 0 ||
           duplicate_probability > 0;
  }
};

struct FaultStats {
  uint64_t sent = 0;  // datagrams the inner link took (duplicates and released ones included)
  uint64_t drops = 0;
  uint64_t reorders = 0;    // datagrams held back
  uint64_t duplicates = 0;  // extra copies the inner link took
};

class FaultyLink final : public DatagramLink {
 public:
  // InvalidArgument for a probability outside [0, 1) or drop_every = 1 (nothing would get through).
  static absl::Status Validate(const FaultOptions& faults);

  // `inner` must outlive this; `faults` must pass Validate. Heads of up to `max_held_head_bytes`
  // may be held back for reordering.
  FaultyLink(DatagramLink* inner, const FaultOptions& faults, size_t max_held_head_bytes);
  FaultyLink(const FaultyLink&) = delete;
  FaultyLink& operator=(const FaultyLink&) = delete;

  uint32_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  Ipv4Endpoint local_endpoint() const override { return inner_->local_endpoint(); }
  // True when the datagram was sent, dropped on purpose or held back; false when the inner link
  // had no room for it (a duplicate may have gone out already).
  bool Send_st(const Ipv4Endpoint& to, std::span<const uint8_t> head,
               std::span<const uint8_t> body) override;
  // Flushes the inner link. A held datagram stays held: it is released by the next send or by
  // ReleaseHeld_st, so a reordering can span a flush.
  void Flush_st() override { inner_->Flush_st(); }
  int Poll_st(DatagramSink* sink, TimeNs now, TimeNs wait) override {
    return inner_->Poll_st(sink, now, wait);
  }
  uint32_t rx_capacity_packets() const override { return inner_->rx_capacity_packets(); }

  // Sends the held datagram, if any (lost if the inner link has no room: the wire dropped it).
  void ReleaseHeld_st();
  bool holding() const { return held_; }

  FaultStats Stats() const;

 private:
  double NextRandom();

  DatagramLink* const inner_;
  const FaultOptions faults_;
  uint64_t count_ = 0;  // datagrams offered, for drop_every
  uint64_t rng_ = 0;
  bool held_ = false;
  Ipv4Endpoint held_to_;
  std::vector<uint8_t> held_head_;
  size_t held_head_bytes_ = 0;
  std::span<const uint8_t> held_body_;
  StatCounter sent_, drops_, reorders_, duplicates_;
};

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_FAULTY_LINK_H_
