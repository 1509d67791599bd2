// transport/datagram/datagram_wire.h — the packet layout of gradlane's reliable datagram protocol
// (GLRD), which carries the peer wire protocol (transport/wire.h frames) over UDP datagrams when
// the daemon drives the NIC itself (DPDK).
//
// Every datagram (the UDP payload) starts with one 128-byte DgramHeader. What follows depends on
// the type:
//   kHello     FrameHeader(kHello) + HelloBody            dialer → acceptor, dst_conn = 0
//   kHelloOk   FrameHeader(kHelloOk)                      acceptor → dialer
//   kReject    FrameHeader(kReject) + ErrorBody + reason  acceptor → dialer (no connection made)
//   kData      [FrameHeader(kData) if kPktFirst] + bytes of one segment, from msg_offset
//   kAck       nothing (the acknowledgement fields are in every header)
//   kClose     FrameHeader(kGoodbye) + ErrorBody + reason either side, best effort
// A segment (one FrameHeader + payload, a "message") is cut into packets; packets carry a
// per-connection sequence number, and every header — data or not — carries the sender's
// receive state: cumulative ack, a selective-ack bitmap, the messages it has finished and which
// of those it rejected, and its credit. docs/protocol.md ("DPDK datagrams") is the normative
// description; the static_asserts pin the layout.
//
// Guarantees: fixed-size, padding-free, trivially copyable, little-endian (sent as in-memory
// bytes, as wire.h). Pure value types: any thread.
#ifndef GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_WIRE_H_
#define GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "transport/wire.h"

namespace gradlane::transport::datagram {

// "GLRD" as bytes on the wire.
inline constexpr uint32_t kDgramMagic = 0x44524C47u;
inline constexpr uint8_t kDgramVersion = 1;

// Values mirror FrameType where the meaning is the same.
enum class DgramType : uint8_t {
  kHello = 1,
  kHelloOk = 2,
  kReject = 3,
  kData = 4,
  kAck = 5,
  kClose = 6,
};
inline constexpr uint8_t kMaxDgramType = 6;

// kData: first / last packet of its message (a one-packet message has both).
inline constexpr uint16_t kPktFirst = 1u << 0;
inline constexpr uint16_t kPktLast = 1u << 1;
// Any type: answer with an acknowledgement now (keepalive probe, tail of a burst).
inline constexpr uint16_t kPktAckNow = 1u << 2;
inline constexpr uint16_t kKnownPktFlags = kPktFirst | kPktLast | kPktAckNow;

// The bitmaps index packets and messages by sequence modulo this, so at most this many packets
// (and messages) may be unacknowledged on one connection: the window never exceeds it.
inline constexpr uint32_t kMaxWindow = 256;

struct DgramHeader {
  uint32_t magic;          // 0   kDgramMagic
  uint8_t version;         // 4   kDgramVersion
  uint8_t type;            // 5   DgramType
  uint16_t flags;          // 6   kPkt*
  uint32_t dst_conn;       // 8   receiver's connection id (0: none yet, kHello)
  uint32_t src_conn;       // 12  sender's connection id
  uint64_t seq;            // 16  kData: packet sequence number (from 0 per connection)
  uint64_t ack;            // 24  every packet below this was received and consumed
  uint64_t msg_ack;        // 32  every message below this was placed or rejected
  uint64_t sack[4];        // 40  bit (s % 256): packet s, ack < s < ack + 256, is held
  uint64_t rejected[4];    // 72  bit (m % 256): message m, msg_ack - 256 <= m < msg_ack, rejected
  uint32_t credit;         // 104 the sender of this header accepts packets below ack + credit
  uint32_t msg_offset;     // 108 kData: offset of this packet's segment bytes in the segment
  uint64_t msg;            // 112 kData: message number (from 0 per connection)
  uint32_t payload_bytes;  // 120 bytes after this header
  uint32_t reserved;       // 124 zero
};
inline constexpr size_t kDgramHeaderBytes = 128;
static_assert(sizeof(DgramHeader) == kDgramHeaderBytes);
static_assert(std::is_trivially_copyable_v<DgramHeader> && std::is_standard_layout_v<DgramHeader>);
static_assert(offsetof(DgramHeader, magic) == 0 && offsetof(DgramHeader, version) == 4 &&
              offsetof(DgramHeader, type) == 5 && offsetof(DgramHeader, flags) == 6 &&
              offsetof(DgramHeader, dst_conn) == 8 && offsetof(DgramHeader, src_conn) == 12 &&
              offsetof(DgramHeader, seq) == 16 && offsetof(DgramHeader, ack) == 24 &&
              offsetof(DgramHeader, msg_ack) == 32 && offsetof(DgramHeader, sack) == 40 &&
              offsetof(DgramHeader, rejected) == 72 && offsetof(DgramHeader, credit) == 104 &&
              offsetof(DgramHeader, msg_offset) == 108 && offsetof(DgramHeader, msg) == 112 &&
              offsetof(DgramHeader, payload_bytes) == 120 &&
              offsetof(DgramHeader, reserved) == 124);

// Smallest datagram the protocol can run on: a header, a FrameHeader and at least one data
// byte (and room for a hello).
inline constexpr size_t kMinDatagramBytes = kDgramHeaderBytes + kFrameHeaderBytes + kHelloBodyBytes;

inline bool BitTest(const uint64_t (&bits)[4], uint64_t i) {
  return (bits[(i % kMaxWindow) / 64] >> (i % 64)) & 1u;
}
inline void BitSet(uint64_t (&bits)[4], uint64_t i, bool v) {
  const uint64_t m = uint64_t{1} << (i % 64);
  uint64_t& w = bits[(i % kMaxWindow) / 64];
  w = v ? (w | m) : (w & ~m);
}

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_DATAGRAM_WIRE_H_
