// transport/verbs/verbs_wire.h — what two daemons exchange over an RDMA reliable connection, on
// top of the peer protocol's 64-byte FrameHeader (transport/wire.h). docs/verbs.md is the
// normative description; the static_asserts pin every layout.
//
// One queue pair carries one direction of segments (like a TCP peer connection: the dialer
// sends segments, the acceptor places them):
//   forward  (sender → receiver, each consumes one receive the receiver posted):
//     SEND  FrameHeader [+ payload]      eager when the payload fits a receive slot
//     RDMA WRITE with immediate = seq    a rendezvous payload, into the target the receiver chose
//   reverse  (receiver → sender, plain RDMA WRITE into the sender's reply region: consumes no
//             receive, so the reverse direction never needs credits and cannot deadlock them):
//     ReplyEntry at index seq % entries  kClearToSend {addr, rkey} | kAck | kRefuse
//     CreditWord                         receives the receiver has posted in all (cumulative)
// Layouts are little-endian in-memory bytes, as on the TCP wire.
#ifndef GRADLANE_TRANSPORT_VERBS_VERBS_WIRE_H_
#define GRADLANE_TRANSPORT_VERBS_VERBS_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "transport/wire.h"

namespace gradlane::transport::verbs {

enum class ReplyKind : uint8_t {
  kClearToSend = 1,  // rendezvous: write the payload to (addr, rkey) with immediate = seq
  kAck = 2,          // eager: placed
  kRefuse = 3,       // no target here: the segment was discarded (the send fails)
};

// One reply, written by the receiver into the sender's ring at index seq % entries. The
// sender polls `stamp` (the last field: a NIC writes a small RDMA WRITE's bytes in address
// order, so a stamp that matches means the entry before it is whole) and accepts the entry
// when stamp == seq + 1 (never 0, so a zeroed ring holds no reply).
struct ReplyEntry {
  uint32_t seq;        // 0  the segment's FrameHeader::seq
  uint8_t kind;        // 4  ReplyKind
  uint8_t reserved0;   // 5  zero
  uint16_t reserved1;  // 6  zero
  uint64_t addr;       // 8  kClearToSend: target address in the receiver's registered memory
  uint32_t rkey;       // 16 kClearToSend: its remote key
  uint32_t reserved2;  // 20 zero
  uint32_t reserved3;  // 24 zero
  uint32_t stamp;      // 28 seq + 1, written last
};
inline constexpr size_t kReplyEntryBytes = 32;
static_assert(sizeof(ReplyEntry) == kReplyEntryBytes);
static_assert(std::is_trivially_copyable_v<ReplyEntry> && std::is_standard_layout_v<ReplyEntry>);
static_assert(offsetof(ReplyEntry, kind) == 4 && offsetof(ReplyEntry, addr) == 8 &&
              offsetof(ReplyEntry, rkey) == 16 && offsetof(ReplyEntry, stamp) == 28);

// Receives the receiver has posted since the connection started, including the initial ones.
// Written by the receiver (8 aligned bytes: one write, never torn), read by the sender.
struct CreditWord {
  uint64_t posted;
};
static_assert(sizeof(CreditWord) == 8 && std::is_trivially_copyable_v<CreditWord>);

// The sender's reply region: `entries` ReplyEntry, then the CreditWord. Registered for remote
// write; its address and rkey travel in the sender's VerbsHello.
inline constexpr size_t ReplyRegionBytes(uint32_t entries) {
  return size_t{entries} * kReplyEntryBytes + sizeof(CreditWord);
}

// The verbs fields each side adds to the TCP hello / hello-ok (transport/common/hello.h) before
// both move their queue pair to ready-to-send.
struct VerbsHello {
  uint32_t qp_num;         // 0  this side's queue pair number
  uint32_t psn;            // 4  its initial packet sequence number (24 bits)
  uint8_t gid[16];         // 8  its port GID (RoCE: the IPv4-mapped or IPv6 address)
  uint8_t gid_index;       // 24 GID table index used
  uint8_t mtu;             // 25 path MTU as ibv_mtu (1 = 256 ... 5 = 4096)
  uint16_t recv_slots;     // 26 receives posted for the peer's forward work at the start
  uint32_t slot_bytes;     // 28 bytes of each receive slot (FrameHeader + eager payload)
  uint64_t reply_addr;     // 32 sender: its reply region (0 on the receiver's side)
  uint32_t reply_rkey;     // 40
  uint32_t reply_entries;  // 44 ReplyEntry count of that region (a power of two)
};
inline constexpr size_t kVerbsHelloBytes = 48;
static_assert(sizeof(VerbsHello) == kVerbsHelloBytes);
static_assert(std::is_trivially_copyable_v<VerbsHello> && std::is_standard_layout_v<VerbsHello>);
static_assert(offsetof(VerbsHello, gid) == 8 && offsetof(VerbsHello, recv_slots) == 26 &&
              offsetof(VerbsHello, reply_addr) == 32 && offsetof(VerbsHello, reply_entries) == 44);

}  // namespace gradlane::transport::verbs

#endif  // GRADLANE_TRANSPORT_VERBS_VERBS_WIRE_H_
