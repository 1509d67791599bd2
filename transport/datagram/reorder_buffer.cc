#include "transport/datagram/reorder_buffer.h"

#include <algorithm>
#include <cstring>

namespace gradlane::transport::datagram {

void ReorderBuffer::Init(uint32_t capacity, uint32_t max_packet_bytes) {
  capacity_ = capacity;
  slot_bytes_ = max_packet_bytes;
  slots_.resize(capacity);
  buf_.resize(static_cast<size_t>(capacity) * max_packet_bytes);
}

void ReorderBuffer::Reset() {
  next_ = 0;
  std::fill(std::begin(sack_), std::end(sack_), 0);
  std::fill(std::begin(rejected_), std::end(rejected_), 0);
  msg_next_ = 0;
  for (Slot& s : slots_) s.present = false;
  unacked_ = 0;
  ack_now_ = false;
  due_since_ = sched::kNever;
}

ReorderBuffer::Verdict ReorderBuffer::OnPacket(uint64_t seq, const Packet& p, TimeNs now) {
  if (seq < next_) {
    ack_now_ = true;  // our ack was probably lost
    return Verdict::kDuplicate;
  }
  if (seq >= next_ + capacity_ || (seq > next_ && p.bytes.size() > slot_bytes_)) {
    ack_now_ = true;
    return Verdict::kBeyondCapacity;
  }
  if (due_since_ == sched::kNever) due_since_ = now;
  if (seq == next_) return Verdict::kInOrder;
  // Tell the sender about the hole at once (fast retransmission).
  ack_now_ = true;
  Slot& slot = slots_[seq % capacity_];
  if (slot.present) return Verdict::kDuplicate;
  slot.present = true;
  slot.flags = p.flags;
  slot.msg = p.msg;
  slot.msg_offset = p.msg_offset;
  slot.bytes = static_cast<uint32_t>(p.bytes.size());
  std::memcpy(buf_.data() + (seq % capacity_) * slot_bytes_, p.bytes.data(), p.bytes.size());
  BitSet(sack_, seq, true);
  return Verdict::kHeld;
}

void ReorderBuffer::Consumed() {
  ++next_;
  ++unacked_;
}

bool ReorderBuffer::NextHeld(Packet* out) {
  Slot& slot = slots_[next_ % capacity_];
  if (!slot.present) return false;
  slot.present = false;
  BitSet(sack_, next_, false);
  out->flags = slot.flags;
  out->msg = slot.msg;
  out->msg_offset = slot.msg_offset;
  out->bytes =
      std::span<const uint8_t>(buf_.data() + (next_ % capacity_) * slot_bytes_, slot.bytes);
  return true;
}

void ReorderBuffer::CompleteMessage(bool accepted) {
  BitSet(rejected_, msg_next_, !accepted);
  ++msg_next_;
  ack_now_ = true;  // the sender's completion and credit return on this
}

void ReorderBuffer::FillAck(DgramHeader& h, uint32_t credit) {
  h.ack = next_;
  h.msg_ack = msg_next_;
  std::memcpy(h.sack, sack_, sizeof(h.sack));
  std::memcpy(h.rejected, rejected_, sizeof(h.rejected));
  h.credit = credit;
  // This header acknowledges everything received so far.
  unacked_ = 0;
  due_since_ = sched::kNever;
  ack_now_ = false;
}

}  // namespace gradlane::transport::datagram
