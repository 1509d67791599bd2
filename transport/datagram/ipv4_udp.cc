#include "transport/datagram/ipv4_udp.h"

#include <bit>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace gradlane::transport::datagram {
namespace {

constexpr uint16_t Be16(uint16_t v) {
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap16(v);
  return v;
}
constexpr uint32_t Be32(uint32_t v) {
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap32(v);
  return v;
}

}  // namespace

// ---- addresses --------------------------------------------------------------------------------

absl::StatusOr<uint32_t> ParseIpv4(std::string_view host_sv) {
  const absl::string_view host(host_sv.data(), host_sv.size());
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4)
    return absl::InvalidArgumentError(absl::StrCat("'", host, "' is not an IPv4 address"));
  uint32_t ip = 0;
  for (absl::string_view p : parts) {
    uint32_t v = 0;
    if (p.empty() || p.size() > 3 || !absl::SimpleAtoi(p, &v) || v > 255) {
      return absl::InvalidArgumentError(absl::StrCat("'", host, "' is not an IPv4 address"));
    }
    ip = ip << 8 | v;
  }
  return ip;
}

absl::StatusOr<Ipv4Endpoint> ParseIpv4Endpoint(std::string_view s_sv) {
  const absl::string_view s(s_sv.data(), s_sv.size());
  const size_t colon = s.rfind(':');
  if (colon == absl::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not IPv4:PORT"));
  auto ip = ParseIpv4(std::string_view(s.data(), colon));
  if (!ip.ok()) return ip.status();
  uint32_t port = 0;
  if (!absl::SimpleAtoi(s.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' has no valid port (1..65535)"));
  }
  return Ipv4Endpoint{*ip, static_cast<uint16_t>(port)};
}

std::string FormatIpv4(uint32_t ip) {
  return absl::StrFormat("%d.%d.%d.%d", ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
}

std::string FormatEndpoint(const Ipv4Endpoint& e) {
  return absl::StrCat(FormatIpv4(e.ip), ":", e.port);
}

// ---- frames -------------------------------------------------------------------------------------

uint16_t Ipv4HeaderChecksum(const Ipv4Header& h) {
  Ipv4Header c = h;
  c.checksum = 0;
  uint16_t words[sizeof(c) / 2];
  std::memcpy(words, &c, sizeof(c));
  // Summed in memory order: the ones' complement sum is the same in either byte order, so the
  // result goes back into the header as it is.
  uint32_t sum = 0;
  for (uint16_t w : words) sum += w;
  sum = (sum >> 16) + (sum & 0xFFFF);
  sum = (sum >> 16) + (sum & 0xFFFF);
  return static_cast<uint16_t>(~sum);
}

uint16_t EtherTypeOf(std::span<const uint8_t> frame) {
  if (frame.size() < sizeof(EthernetHeader)) return 0;
  uint16_t t;
  std::memcpy(&t, frame.data() + offsetof(EthernetHeader, ether_type), sizeof(t));
  return Be16(t);
}

void WriteUdpFrameHeader(std::span<uint8_t, kUdpFrameHeaderBytes> out,
                         std::span<const uint8_t, 6> dst_mac, std::span<const uint8_t, 6> src_mac,
                         const Ipv4Endpoint& from, const Ipv4Endpoint& to, uint16_t ip_id,
                         size_t datagram_bytes) {
  EthernetHeader eth;
  std::memcpy(eth.dst, dst_mac.data(), 6);
  std::memcpy(eth.src, src_mac.data(), 6);
  eth.ether_type = Be16(kEtherTypeIpv4);
  Ipv4Header ip;
  ip.version_ihl = kIpv4VersionIhl;
  ip.tos = 0;
  ip.total_length = Be16(static_cast<uint16_t>(kIpv4UdpHeaderBytes + datagram_bytes));
  ip.packet_id = Be16(ip_id);
  ip.fragment = Be16(kIpv4DontFragment);
  ip.ttl = kIpv4Ttl;
  ip.protocol = kIpProtoUdp;
  ip.checksum = 0;
  ip.src = Be32(from.ip);
  ip.dst = Be32(to.ip);
  ip.checksum = Ipv4HeaderChecksum(ip);
  UdpHeader udp;
  udp.src_port = Be16(from.port);
  udp.dst_port = Be16(to.port);
  udp.length = Be16(static_cast<uint16_t>(sizeof(UdpHeader) + datagram_bytes));
  udp.checksum = 0;
  std::memcpy(out.data(), &eth, sizeof(eth));
  std::memcpy(out.data() + sizeof(eth), &ip, sizeof(ip));
  std::memcpy(out.data() + sizeof(eth) + sizeof(ip), &udp, sizeof(udp));
}

std::optional<UdpFrame> ParseUdpFrame(std::span<const uint8_t> frame, const Ipv4Endpoint& self) {
  if (frame.size() < kUdpFrameHeaderBytes || EtherTypeOf(frame) != kEtherTypeIpv4)
    return std::nullopt;
  Ipv4Header ip;
  UdpHeader udp;
  std::memcpy(&ip, frame.data() + sizeof(EthernetHeader), sizeof(ip));
  std::memcpy(&udp, frame.data() + sizeof(EthernetHeader) + sizeof(ip), sizeof(udp));
  const uint32_t ip_len = Be16(ip.total_length);
  const uint32_t udp_len = Be16(udp.length);
  if (ip.version_ihl != kIpv4VersionIhl || ip.protocol != kIpProtoUdp || Be32(ip.dst) != self.ip ||
      Be16(udp.dst_port) != self.port ||
      (Be16(ip.fragment) & (kIpv4MoreFragments | kIpv4OffsetMask)) != 0 ||
      ip_len + sizeof(EthernetHeader) > frame.size() || udp_len < sizeof(UdpHeader) ||
      udp_len + sizeof(Ipv4Header) != ip_len) {
    return std::nullopt;
  }
  return UdpFrame{Ipv4Endpoint{Be32(ip.src), Be16(udp.src_port)},
                  frame.subspan(offsetof(EthernetHeader, src)).first<6>(),
                  frame.subspan(kUdpFrameHeaderBytes, udp_len - sizeof(UdpHeader))};
}

}  // namespace gradlane::transport::datagram
