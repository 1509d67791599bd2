// IPv4 addresses and the Ethernet + IPv4 + UDP framing of the datagram protocol
// (transport/datagram/ipv4_udp.h): text round trips and refusals, the RFC 791 header checksum
// against a known header, the exact bytes we put on the wire, and every kind of frame the DPDK
// port must drop before the protocol sees it.
#include "transport/datagram/ipv4_udp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

namespace gradlane::transport::datagram {
namespace {

TEST(Ipv4, ParseAndFormat) {
  auto e = ParseIpv4Endpoint("192.168.77.1:7610");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->ip, 0xC0A84D01u);
  EXPECT_EQ(FormatEndpoint(*e), "192.168.77.1:7610");
  EXPECT_FALSE(ParseIpv4Endpoint("192.168.77:1").ok());
  EXPECT_FALSE(ParseIpv4Endpoint("192.168.77.256:1").ok());
  EXPECT_FALSE(ParseIpv4Endpoint("[::1]:1").ok());
}

TEST(Ipv4, RefusesWhatIsNotIpv4ColonPort) {
  for (const char* bad :
       {"10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:x", "10.0.0:80",
        "10.0.0.1.5:80", "a.b.c.d:80", "10..0.1:80", "1000.0.0.1:80", "host:80", ":80", ""}) {
    auto e = ParseIpv4Endpoint(bad);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
  auto top = ParseIpv4Endpoint("255.255.255.255:65535");
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(*top, (Ipv4Endpoint{0xFFFFFFFFu, 65535}));
  EXPECT_EQ(FormatIpv4(0), "0.0.0.0");
  EXPECT_EQ(*ParseIpv4("10.1.2.3"), 0x0A010203u);
}

// The header of RFC 1071's usual worked example (a UDP packet 192.168.0.1 → 192.168.0.199):
// its checksum is 0xB861.
TEST(Ipv4, HeaderChecksumOfAKnownHeader) {
  const uint8_t bytes[20] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                             0xB8, 0x61, 0xC0, 0xA8, 0x00, 0x01, 0xC0, 0xA8, 0x00, 0xC7};
  Ipv4Header h;
  std::memcpy(&h, bytes, sizeof(h));
  const uint16_t c = Ipv4HeaderChecksum(h);  // the stored 0xB861 is ignored
  uint8_t got[2];
  std::memcpy(got, &c, 2);
  EXPECT_EQ(got[0], 0xB8);
  EXPECT_EQ(got[1], 0x61);
}

constexpr std::array<uint8_t, 6> kDstMac = {0x02, 0x00, 0x00, 0x00, 0x00, 0x02};
constexpr std::array<uint8_t, 6> kSrcMac = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
constexpr Ipv4Endpoint kFrom{0x0A000001, 7610};
constexpr Ipv4Endpoint kTo{0x0A000002, 7611};

std::vector<uint8_t> Frame(size_t datagram_bytes, uint16_t ip_id = 9) {
  std::vector<uint8_t> f(kUdpFrameHeaderBytes + datagram_bytes);
  WriteUdpFrameHeader(std::span<uint8_t, kUdpFrameHeaderBytes>(f.data(), kUdpFrameHeaderBytes),
                      kDstMac, kSrcMac, kFrom, kTo, ip_id, datagram_bytes);
  for (size_t i = 0; i < datagram_bytes; ++i)
    f[kUdpFrameHeaderBytes + i] = static_cast<uint8_t>(i * 7 + 1);
  return f;
}

TEST(UdpFrame, HeaderBytesAreExactlyWhatWeSend) {
  const std::vector<uint8_t> f = Frame(100, 0x1234);
  const uint8_t want[kUdpFrameHeaderBytes] = {
      0x02, 0x00, 0x00, 0x00, 0x00, 0x02,        // dst MAC
      0x02, 0x00, 0x00, 0x00, 0x00, 0x01,        // src MAC
      0x08, 0x00,                                // IPv4
      0x45, 0x00, 0x00, 128,                     // no options; total length 20 + 8 + 100
      0x12, 0x34, 0x40, 0x00,                    // identification, don't fragment
      64,   17,   0x00, 0x00,                    // TTL, UDP, checksum (checked below)
      10,   0,    0,    1,    10,   0,    0, 2,  // src, dst
      0x1D, 0xBA, 0x1D, 0xBB,                    // ports 7610, 7611
      0x00, 108,  0x00, 0x00,                    // UDP length 8 + 100, no checksum
  };
  for (size_t i = 0; i < kUdpFrameHeaderBytes; ++i) {
    if (i == 24 || i == 25) continue;
    EXPECT_EQ(f[i], want[i]) << "byte " << i;
  }
  // A correct checksum makes the header's 16-bit words sum to 0xFFFF (ones' complement).
  uint32_t sum = 0;
  for (size_t i = 14; i < 34; i += 2) sum += static_cast<uint32_t>(f[i] << 8 | f[i + 1]);
  while (sum > 0xFFFF) sum = (sum >> 16) + (sum & 0xFFFF);
  EXPECT_EQ(sum, 0xFFFFu);
}

TEST(UdpFrame, RoundTripsToTheReceiver) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1472}, size_t{8972}}) {
    const std::vector<uint8_t> f = Frame(n);
    EXPECT_EQ(EtherTypeOf(f), kEtherTypeIpv4);
    const auto got = ParseUdpFrame(f, kTo);
    ASSERT_TRUE(got.has_value()) << n;
    EXPECT_EQ(got->from, kFrom);
    EXPECT_TRUE(std::equal(got->src_mac.begin(), got->src_mac.end(), kSrcMac.begin()));
    ASSERT_EQ(got->datagram.size(), n);
    EXPECT_EQ(got->datagram.data(), f.data() + kUdpFrameHeaderBytes);  // no copy
  }
}

TEST(UdpFrame, EthernetPaddingAfterAShortDatagramIsIgnored) {
  std::vector<uint8_t> f = Frame(3);
  f.resize(60, 0);  // the minimum Ethernet frame: the NIC pads
  const auto got = ParseUdpFrame(f, kTo);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->datagram.size(), 3u);
}

TEST(UdpFrame, DropsWhatIsNotForUsOrNotPlain) {
  auto refused = [](std::vector<uint8_t> f, const char* why) {
    EXPECT_FALSE(ParseUdpFrame(f, kTo).has_value()) << why;
  };
  // Not for us.
  EXPECT_FALSE(ParseUdpFrame(Frame(10), Ipv4Endpoint{0x0A000003, 7611}).has_value());
  EXPECT_FALSE(ParseUdpFrame(Frame(10), Ipv4Endpoint{0x0A000002, 7612}).has_value());
  std::vector<uint8_t> f;
  f = Frame(10);
  f[12] = 0x08;
  f[13] = 0x06;
  refused(f, "ARP");
  f = Frame(10);
  f[12] = 0x86;
  f[13] = 0xDD;
  refused(f, "IPv6 ethertype");
  f = Frame(10);
  f[14] = 0x46;
  refused(f, "IP options");
  f = Frame(10);
  f[14] = 0x65;
  refused(f, "IP version 6");
  f = Frame(10);
  f[23] = 6;
  refused(f, "TCP");
  f = Frame(10);
  f[20] |= 0x20;
  refused(f, "more fragments");
  f = Frame(10);
  f[21] = 1;
  refused(f, "fragment offset");
  f = Frame(10);
  f[17] = 20 + 8 + 11;
  f[39] = 8 + 11;
  refused(f, "IP and UDP lengths past the frame");
  f = Frame(10);
  f[17] = 20 + 7;
  f[39] = 7;
  refused(f, "UDP length below its header");
  f = Frame(10);
  f[39] = 8 + 9;
  refused(f, "UDP length disagrees with IP length");
  f = Frame(10);
  f.resize(kUdpFrameHeaderBytes - 1);
  refused(f, "shorter than the headers");
  refused({}, "empty");
  // Don't-fragment and a wrong checksum are no reason to drop.
  f = Frame(10);
  f[20] = 0;
  EXPECT_TRUE(ParseUdpFrame(f, kTo).has_value());
  f = Frame(10);
  f[24] ^= 0xFF;
  EXPECT_TRUE(ParseUdpFrame(f, kTo).has_value());
}

TEST(UdpFrame, EtherTypeOfAShortFrameIsZero) {
  const uint8_t runt[13] = {};
  EXPECT_EQ(EtherTypeOf(runt), 0);
  std::vector<uint8_t> arp(42, 0);
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_EQ(EtherTypeOf(arp), kEtherTypeArp);
}

}  // namespace
}  // namespace gradlane::transport::datagram
