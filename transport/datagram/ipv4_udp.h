// transport/datagram/ipv4_udp.h — IPv4 addresses and the Ethernet + IPv4 + UDP headers around a
// datagram of the reliable protocol.
//
// The protocol runs over real UDP flows (so they route, and a NIC's RSS hashes them, like any
// other traffic), IPv4 only. The framing is plain code rather than DPDK's header structs so the
// rules for what we send and what we accept are unit-tested and fuzzable without a NIC; the DPDK
// port (transport/dpdk/) only moves the bytes.
//
// What we accept is narrow on purpose: anyone on the segment can send us a frame, and anything
// unusual (IP options, fragments, lengths that disagree) is cheaper to drop than to handle; the
// protocol's retransmission covers a peer whose frame was dropped.
//
// Guarantees: headers are read and written with memcpy, so a frame may sit at any alignment.
// WriteUdpFrameHeader / ParseUdpFrame / EtherTypeOf never allocate (data path); the text
// functions (Parse*/Format*) do (control path). Pure functions: any thread.
#ifndef GRADLANE_TRANSPORT_DATAGRAM_IPV4_UDP_H_
#define GRADLANE_TRANSPORT_DATAGRAM_IPV4_UDP_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"

namespace gradlane::transport::datagram {

// An IPv4 address and UDP port, host byte order.
struct Ipv4Endpoint {
  uint32_t ip = 0;
  uint16_t port = 0;
  bool operator==(const Ipv4Endpoint&) const = default;
};
// "a.b.c.d:port" → endpoint; InvalidArgument otherwise (the DPDK backend speaks IPv4 only).
absl::StatusOr<Ipv4Endpoint> ParseIpv4Endpoint(std::string_view host_port);
absl::StatusOr<uint32_t> ParseIpv4(std::string_view host);
std::string FormatIpv4(uint32_t ip);
std::string FormatEndpoint(const Ipv4Endpoint& e);

// ---- frames -------------------------------------------------------------------------------------
// Multi-byte fields below are big-endian on the wire and kept so in these structs.

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint8_t kIpv4VersionIhl = 0x45;  // version 4, 5 words: no options
inline constexpr uint16_t kIpv4DontFragment = 0x4000;
inline constexpr uint16_t kIpv4MoreFragments = 0x2000;
inline constexpr uint16_t kIpv4OffsetMask = 0x1FFF;
inline constexpr uint8_t kIpv4Ttl = 64;

struct EthernetHeader {
  uint8_t dst[6];
  uint8_t src[6];
  uint16_t ether_type;
};
struct Ipv4Header {
  uint8_t version_ihl;
  uint8_t tos;
  uint16_t total_length;  // IPv4 header + UDP header + datagram
  uint16_t packet_id;
  uint16_t fragment;  // flags (DF, MF) and offset
  uint8_t ttl;
  uint8_t protocol;
  uint16_t checksum;
  uint32_t src;
  uint32_t dst;
};
struct UdpHeader {
  uint16_t src_port;
  uint16_t dst_port;
  uint16_t length;    // UDP header + datagram
  uint16_t checksum;  // 0: none (allowed in IPv4)
};
static_assert(sizeof(EthernetHeader) == 14 && offsetof(EthernetHeader, ether_type) == 12);
static_assert(sizeof(Ipv4Header) == 20 && offsetof(Ipv4Header, total_length) == 2 &&
              offsetof(Ipv4Header, packet_id) == 4 && offsetof(Ipv4Header, fragment) == 6 &&
              offsetof(Ipv4Header, ttl) == 8 && offsetof(Ipv4Header, protocol) == 9 &&
              offsetof(Ipv4Header, checksum) == 10 && offsetof(Ipv4Header, src) == 12 &&
              offsetof(Ipv4Header, dst) == 16);
static_assert(sizeof(UdpHeader) == 8 && offsetof(UdpHeader, length) == 4);
static_assert(std::is_trivially_copyable_v<EthernetHeader> &&
              std::is_trivially_copyable_v<Ipv4Header> && std::is_trivially_copyable_v<UdpHeader>);

// What precedes the datagram in every frame we send and accept.
inline constexpr size_t kUdpFrameHeaderBytes =
    sizeof(EthernetHeader) + sizeof(Ipv4Header) + sizeof(UdpHeader);
static_assert(kUdpFrameHeaderBytes == 42);
// IPv4 + UDP headers: an MTU minus this is the largest datagram.
inline constexpr size_t kIpv4UdpHeaderBytes = sizeof(Ipv4Header) + sizeof(UdpHeader);

// The IPv4 header checksum (RFC 791: ones' complement of the ones' complement sum of the 16-bit
// words), with the header's own checksum field counted as zero. Stored as computed, it makes the
// header sum to 0xFFFF.
uint16_t Ipv4HeaderChecksum(const Ipv4Header& h);

// The frame's EtherType (host order); 0 for a frame shorter than an Ethernet header.
uint16_t EtherTypeOf(std::span<const uint8_t> frame);

// Writes the kUdpFrameHeaderBytes that go before a datagram of `datagram_bytes` from `from` to
// `to`: IPv4 with don't-fragment set (the protocol sizes datagrams to the MTU itself), TTL 64,
// identification `ip_id`, a header checksum, and no UDP checksum (optional in IPv4; the Ethernet
// FCS covers the link, and computing one would read the whole payload).
void WriteUdpFrameHeader(std::span<uint8_t, kUdpFrameHeaderBytes> out,
                         std::span<const uint8_t, 6> dst_mac, std::span<const uint8_t, 6> src_mac,
                         const Ipv4Endpoint& from, const Ipv4Endpoint& to, uint16_t ip_id,
                         size_t datagram_bytes);

// A received frame's datagram and where it came from; the spans point into the frame.
struct UdpFrame {
  Ipv4Endpoint from;
  std::span<const uint8_t, 6> src_mac;
  std::span<const uint8_t> datagram;
};
// The datagram of an IPv4/UDP frame addressed to `self` (address and port): IPv4 without options,
// not a fragment, whose IPv4 and UDP lengths agree with each other and fit in the frame (trailing
// Ethernet padding is allowed). nullopt for anything else. The IPv4 checksum is not verified:
// the Ethernet FCS, which the NIC checks, already covers the whole frame.
std::optional<UdpFrame> ParseUdpFrame(std::span<const uint8_t> frame, const Ipv4Endpoint& self);

}  // namespace gradlane::transport::datagram

#endif  // GRADLANE_TRANSPORT_DATAGRAM_IPV4_UDP_H_
