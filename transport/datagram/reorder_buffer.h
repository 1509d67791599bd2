// transport/datagram/reorder_buffer.h — the receive side of one connection of the reliable
// datagram protocol: packets into sequence order, and the acknowledgement fields that tell the
// sender what arrived.
//
// Packets are released strictly in sequence order, each exactly once. A packet that arrives in
// order is not copied: the caller consumes it straight from the link's buffer (into the
// destination tensor, usually). Only a packet that arrives early is copied, into one of
// `capacity` fixed slots, and released when the gap before it fills. Anything at or beyond
// next() + capacity is refused, and so is an early packet larger than a slot: the sender's
// credit never lets it send that far, so such a packet is a bug or an attack, and holding it
// would overwrite a slot still in use. Duplicates (already released, or already held) are
// dropped; the first copy wins.
//
// What the receiver tells the sender rides on every header it sends (FillAck): the cumulative
// ack (every packet below it released), a selective-ack bitmap of the held ones, the messages
// finished and which of them were rejected, and the credit. Sending a header with these fields
// pays off the acknowledgement owed. A pure ack is owed (AckDue):
//   - at once after anything out of order, duplicated or refused (the sender needs the
//     selective ack to repair a hole quickly, or its ack was lost), after a message completes
//     (the sender's completion and credit return on it), or when the sender asked (kPktAckNow);
//   - otherwise after `ack_every` in-order packets, or `ack_delay` after the first unacked one,
//     whichever comes first, so a stream of data is acked in batches, not per packet.
//
// Guarantees: slots are allocated once by Init (control path); nothing else allocates. A held
// packet's bytes (from NextHeld) stay valid until that slot is reused, i.e. until a packet
// `capacity` further on is held. Single-threaded: the engine thread that owns the connection.
#ifndef GRADLANE_TRANSPORT_DATAGRAM_REORDER_BUFFER_H_
#define GRADLANE_TRANSPORT_DATAGRAM_REORDER_BUFFER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "sched/types.h"
#include "transport/datagram/datagram_wire.h"

namespace gradlane::transport::datagram {

using sched::TimeNs;

class ReorderBuffer {
 public:
  // A data packet as the transport sees it: header fields and its bytes of the segment.
  struct Packet {
    uint16_t flags = 0;
    uint64_t msg = 0;
    uint32_t msg_offset = 0;
    std::span<const uint8_t> bytes;
  };

  enum class Verdict {
    kInOrder,         // the next one: consume it now, then Consumed()
    kHeld,            // early: copied, released later by NextHeld
    kDuplicate,       // released or held already: dropped
    kBeyondCapacity,  // past what the buffer may hold: dropped
  };

  // Control path, once per connection slot: `capacity` slots (at most kMaxWindow) of
  // `max_packet_bytes` each.
  void Init(uint32_t capacity, uint32_t max_packet_bytes);
  // A new connection: sequence and message numbers from 0, nothing held or owed. Keeps the slots.
  void Reset();

  // One data packet with sequence number `seq`, at `now`.
  Verdict OnPacket(uint64_t seq, const Packet& p, TimeNs now);
  // The packet at next() (kInOrder, or from NextHeld) was consumed: move past it.
  void Consumed();
  // The held packet at next(), if there is one: it is released (taken out of the selective ack)
  // and must be consumed next.
  bool NextHeld(Packet* out);

  // The message next_message() was placed (accepted) or refused by the receiver (rejected).
  void CompleteMessage(bool accepted);

  // ---- acknowledgements
  // The peer asked for an ack now.
  void AckNow() { ack_now_ = true; }
  bool AckDue(TimeNs now, uint32_t ack_every, TimeNs ack_delay) const {
    return ack_now_ || (due_since_ != sched::kNever &&
                        (unacked_ >= ack_every || now - due_since_ >= ack_delay));
  }
  // Something received waits for an acknowledgement (the delay timer runs).
  bool AckPending() const { return due_since_ != sched::kNever; }
  // Writes our receive state and `credit` into `h`; it then counts as the acknowledgement owed.
  void FillAck(DgramHeader& h, uint32_t credit);
  // What is owed, to put back if the header carrying FillAck's fields could not be sent.
  struct Owed {
    uint32_t unacked = 0;
    TimeNs due_since = sched::kNever;
    bool now = false;
  };
  Owed owed() const { return Owed{unacked_, due_since_, ack_now_}; }
  void Restore(const Owed& o) {
    unacked_ = o.unacked;
    due_since_ = o.due_since;
    ack_now_ = o.now;
  }

  uint64_t next() const { return next_; }              // cumulative ack
  uint64_t next_message() const { return msg_next_; }  // messages below it are finished
  uint32_t capacity() const { return capacity_; }
  uint32_t max_packet_bytes() const { return slot_bytes_; }

 private:
  struct Slot {
    bool present = false;
    uint16_t flags = 0;
    uint32_t msg_offset = 0;
    uint32_t bytes = 0;
    uint64_t msg = 0;
  };

  uint32_t capacity_ = 0;
  uint32_t slot_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint8_t> buf_;  // capacity × slot_bytes: the held packets' bytes
  uint64_t next_ = 0;
  uint64_t sack_[4] = {0, 0, 0, 0};
  uint64_t rejected_[4] = {0, 0, 0, 0};
  uint64_t msg_next_ = 0;
  uint32_t unacked_ = 0;  // packets released since the last ack sent
  bool ack_now_ = false;
  TimeNs due_since_ = sched::kNever;  // first packet the owed ack covers
};

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_REORDER_BUFFER_H_
